"""A SIGTERM at the two edges of a container's life: between the engine's answer to the create
and the tool holding it, and while the tool removes it.

`WorkContainer` removes its container on every way out, SIGTERM included (signals.py makes it
SystemExit). `create_container` removes the container by name when its own call is cut short;
but the signal can also land just after that call returned, before the container was stored,
and then nothing held it: a CI run once found the work container of a SIGTERMed run still
there (test_image_pipeline's killed-run test). The exact instant cannot be hit with a real
engine on demand (a fault we cannot cause), so a stand-in engine plays the calls, and a trace
hook raises the SystemExit at the create's return; the real SIGTERM path is tested against the
real engine in test_image_pipeline.py.

The evaluate server's container (`DockerEngine.started`) had the same gap; its test below runs
the real `DockerEngine` against a stand-in client and raises at the return of its own
`create_container`.

A SIGTERM that arrives while a removal is under way used to cut it short (the container then
waited for the next run's clean-up); it is now held until the removal ends and then ends the run
(exit 143). A second one ends it at once, so an engine that hangs cannot make the run unkillable.
The stand-ins send the signals to this process from inside their removal.

The work container asks whether the image has `timeout` on a thread of its own, started right
after the container (`WorkContainer._check_timeout`); the stand-in engine answers that exec, so
the real check runs here, beside the start, and the SIGTERM tests wait for the threads the tool
started (and none may end with an exception).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import SimpleNamespace

import docker.errors
import pytest

from dspark_patch.targets.docker.client import DockerEngine
from dspark_patch.targets.docker.container import WorkContainer

from .support.exec_frames import output_of


class Engine:
    """Makes and removes containers by name, as the engine's API does, and runs execs in them
    (each exits 0; the image has `timeout`). With `terms_in_removal`, that many SIGTERMs reach
    this process while a removal is under way (a CI job's cancel).

    `execs` lists each exec asked for: its command and whether the main thread asked. An exec
    asked from another thread first waits for `beside_may_go` (set unless a test holds it), then
    fails as the engine's does when its container is gone or not running."""

    def __init__(self, terms_in_removal: int = 0) -> None:
        self.alive: set[str] = set()
        self.running: set[str] = set()
        self.terms_in_removal = terms_in_removal
        self.execs: list[tuple[tuple[str, ...], str]] = []
        self.beside_may_go = threading.Event()
        self.beside_may_go.set()
        self._exec_in: dict[str, str] = {}
        self.api = SimpleNamespace(exec_create=self.exec_create, exec_start=self.exec_start,
                                   exec_inspect=self.exec_inspect)

    def create_container(self, image_id: str, *, name: str, **options: object) -> object:
        self.alive.add(name)
        engine = self

        class Container:
            id = name
            client = SimpleNamespace(api=engine.api)

            def start(self) -> None:
                engine.running.add(name)

            def remove(self, **options: object) -> None:
                engine.remove_container(name)

        return Container()

    def remove_container(self, name_or_id: str) -> None:
        for _ in range(self.terms_in_removal):
            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before the next line
        self.alive.discard(name_or_id)
        self.running.discard(name_or_id)

    def exec_create(self, container_id: str, cmd: list[str], **options: object) -> dict:
        main = threading.current_thread() is threading.main_thread()
        if not main:
            self.beside_may_go.wait()
        self.execs.append((tuple(cmd), "main" if main else "beside"))
        if container_id not in self.alive:
            raise docker.errors.NotFound(f"No such container: {container_id}")
        if container_id not in self.running:
            raise docker.errors.APIError(f"container {container_id} is not running")
        exec_id = f"exec-{len(self._exec_in)}"
        self._exec_in[exec_id] = container_id
        return {"Id": exec_id}

    def exec_start(self, exec_id: str, demux: bool = False, **options: object) -> object:
        if self._exec_in[exec_id] not in self.running:
            raise docker.errors.APIError(f"container {self._exec_in[exec_id]} is not running")
        return output_of(b"", b"") if options.get("socket") else b""

    def exec_inspect(self, exec_id: str) -> dict:
        return {"Running": False, "ExitCode": 0}


@pytest.fixture(autouse=True)
def threads_of_the_tool(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The threads a test's tool code started are waited for at its end; none may have ended
    with an exception (the work container's `timeout` check must stay quiet)."""
    before = set(threading.enumerate())
    errors: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    yield
    for thread in set(threading.enumerate()) - before:
        thread.join()
    assert errors == []


def _terminated_at_the_return_of(code):  # type: ignore[no-untyped-def]
    """A trace hook that raises SIGTERM's SystemExit as the function of `code` returns."""
    def tracer(frame, event, arg):  # type: ignore[no-untyped-def]
        if frame.f_code is code:
            def on_return(frame, event, arg):  # type: ignore[no-untyped-def]
                if event == "return":
                    raise SystemExit(143)
                return on_return
            return on_return
        return None
    return tracer


def _work(engine: Engine) -> WorkContainer:
    return WorkContainer(engine, "sha256:" + "0" * 64, ref="img", python="python3",  # type: ignore[arg-type]
                         keepalive={"entrypoint": ["python3"], "command": None})


def test_a_sigterm_right_after_the_create_leaves_no_container() -> None:
    engine = Engine()
    work = _work(engine)
    sys.settrace(_terminated_at_the_return_of(Engine.create_container.__code__))
    try:
        with pytest.raises(SystemExit):
            work.__enter__()
    finally:
        sys.settrace(None)
    assert engine.alive == set()


def test_a_sigterm_during_the_removal_waits_for_it_and_then_ends_the_run() -> None:
    engine = Engine(terms_in_removal=1)
    work = _work(engine)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as ended:
        with work:
            pass
    assert ended.value.code == 143 and engine.alive == set()
    assert signal.getsignal(signal.SIGTERM) is before  # the run's own handler is back


def test_a_second_sigterm_during_the_removal_ends_the_run_at_once() -> None:
    # the way out when the engine hangs in the removal: the container is left to the next
    # run's clean-up (`gc`), as with no deferral at all
    engine = Engine(terms_in_removal=2)
    work = _work(engine)
    with pytest.raises(SystemExit) as ended:
        with work:
            pass
    assert ended.value.code == 143 and len(engine.alive) == 1


def test_a_start_that_ends_normally_keeps_its_container_until_the_exit() -> None:
    engine = Engine()
    work = _work(engine)
    with work:
        assert len(engine.alive) == 1
    assert engine.alive == set()


def test_the_timeout_check_runs_beside_the_start_and_the_first_call_uses_its_answer() -> None:
    # The check is started with the container so that the first exec need not wait for its
    # round trips; the first call waits for it (a join, no sleep) and wraps its command.
    engine = Engine()
    with _work(engine) as work:
        result = work.call(["python3", "-c", "pass"], timeout=30)
    assert (result.returncode, result.timed_out) == (0, False)
    assert engine.execs == [
        (("timeout", "--help"), "beside"),
        (("timeout", "-k", "5", "30", "python3", "-c", "pass"), "main"),
    ]


class Client:
    """The part of the Docker SDK's client that `DockerEngine.started` reaches: containers made
    under a name with an id of their own, removed by either (as the engine's API does)."""

    def __init__(self, terms_in_removal: int = 0) -> None:
        self.alive: dict[str, str] = {}  # id -> name
        client = self

        class Containers:
            def create(self, image_id: str, *, name: str, **options: object) -> object:
                container_id = f"id-of-{name}"
                client.alive[container_id] = name

                class Container:
                    id = container_id

                    def start(self) -> None:
                        pass

                return Container()

        class Api:
            def remove_container(self, name_or_id: str, **options: object) -> None:
                for _ in range(terms_in_removal):
                    os.kill(os.getpid(), signal.SIGTERM)
                for container_id, name in list(client.alive.items()):
                    if name_or_id in (container_id, name):
                        del client.alive[container_id]

        self.containers = Containers()
        self.api = Api()

    def ping(self) -> bool:
        return True


def test_a_sigterm_right_after_the_evaluate_servers_create_leaves_no_container() -> None:
    client = Client()
    engine = DockerEngine(client)  # type: ignore[arg-type]
    started = engine.started("sha256:" + "0" * 64, role="evaluate", command=["serve"], env={}, gpus=False)
    sys.settrace(_terminated_at_the_return_of(DockerEngine.create_container.__code__))
    try:
        with pytest.raises(SystemExit):
            started.__enter__()
    finally:
        sys.settrace(None)
    assert client.alive == {}


def test_the_evaluate_servers_container_lives_for_the_block_and_goes_after_it() -> None:
    client = Client()
    with DockerEngine(client).started("sha256:" + "0" * 64, role="evaluate", command=["serve"],  # type: ignore[arg-type]
                                      env={}, gpus=False) as handle:
        assert list(client.alive) == [handle.id]
    assert client.alive == {}


def test_a_sigterm_during_the_evaluate_servers_removal_waits_for_it() -> None:
    client = Client(terms_in_removal=1)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as ended:
        with DockerEngine(client).started("sha256:" + "0" * 64, role="evaluate", command=["serve"],  # type: ignore[arg-type]
                                          env={}, gpus=False):
            pass
    assert ended.value.code == 143 and client.alive == {}
    assert signal.getsignal(signal.SIGTERM) is before


# --- a SIGTERM at every line ----------------------------------------------------------------
# The two edges above were found one CI flake at a time; a CI run then found the work container
# of a SIGTERMed run left again: the signal had landed after the start (the container held, so
# nothing removed it by name), while the entry that had failed was never exited. Here the
# SystemExit is raised at each line the tool's own code runs, from the create on, one run per
# line, until a run ends with none raised: every line of the way in must leave nothing behind.

from pathlib import Path  # noqa: E402

from dspark_patch.targets.base import ImageInfo  # noqa: E402
from dspark_patch.targets.docker import client as client_module  # noqa: E402
from dspark_patch.targets.docker import container as container_module  # noqa: E402
from dspark_patch.targets.docker import emulation as emulation_module  # noqa: E402
from dspark_patch.targets.docker import reader as reader_module  # noqa: E402
from dspark_patch.targets.docker import signals as signals_module  # noqa: E402
from dspark_patch.targets.docker import target as target_module  # noqa: E402

_OWN = {str(Path(m.__file__).resolve()) for m in (  # type: ignore[type-var]
    client_module, container_module, signals_module, target_module, reader_module, emulation_module)}


def _terminated_at_line(n: int, armed):  # type: ignore[no-untyped-def]
    """A trace hook that raises SIGTERM's SystemExit at the `n`-th line run in the tool's own
    code (client.py, container.py, signals.py, target.py, reader.py, emulation.py) once `armed()` says the container exists.
    `fired` says whether it did."""
    seen = [0]
    fired = [False]

    def local(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "line" and armed():
            if seen[0] == n:
                fired[0] = True
                raise SystemExit(143)
            seen[0] += 1
        return local

    def tracer(frame, event, arg):  # type: ignore[no-untyped-def]
        return local if frame.f_code.co_filename in _OWN else None
    return tracer, fired


def _every_line(enter, alive, armed=None, beside_may_go=None):  # type: ignore[no-untyped-def]
    """Runs `enter()` once per line (see above) while `armed()` (default: a container is
    alive); returns how many lines were tried. Each run must end with no container alive,
    whether the SystemExit came or not.

    With `beside_may_go` (the stand-in engine's event), the execs asked from the tool's other
    threads (the work container's `timeout` check) are held until the run has left, so that
    check always meets the container gone, as after a SIGTERM: a thread still waiting then must
    not keep the process alive (a daemon), and it must end quietly once let go."""
    before = signal.getsignal(signal.SIGTERM)
    n = 0
    while True:
        threads = set(threading.enumerate())
        if beside_may_go is not None:
            beside_may_go.clear()
        tracer, fired = _terminated_at_line(n, lambda: bool((armed or alive)()))
        sys.settrace(tracer)
        try:
            leave = enter()
        except SystemExit:
            leave = None
        finally:
            sys.settrace(None)
        if leave is not None:
            leave()
        started = set(threading.enumerate()) - threads
        try:
            assert all(thread.daemon for thread in started), f"a SIGTERM at line {n}: a thread would hold the exit"
        finally:
            if beside_may_go is not None:
                beside_may_go.set()
            for thread in started:
                thread.join()
        assert not alive(), f"a SIGTERM at line {n} after the create left {alive()}"
        assert signal.getsignal(signal.SIGTERM) is before, f"a SIGTERM at line {n} left its handler"
        if not fired[0]:
            return n
        n += 1


def test_a_sigterm_at_any_line_of_the_work_containers_start_leaves_no_container() -> None:
    engine = Engine()

    def enter():  # type: ignore[no-untyped-def]
        work = _work(engine)
        work.__enter__()
        return lambda: work.__exit__(None, None, None)

    # lines were tried (the create happened), and the real check ran on its thread
    assert _every_line(enter, lambda: engine.alive, beside_may_go=engine.beside_may_go) > 0
    assert engine.execs[-1] == (("timeout", "--help"), "beside")


class TargetEngine(Engine):
    """The part of the engine an image target's entry reaches besides the container's."""

    def ensure_image(self, ref: str, **options: object) -> tuple[ImageInfo, bool]:
        return ImageInfo(id="sha256:" + "0" * 64, config={}, layers=1, repo_tags=(ref,)), False

    def gc_containers(self) -> list[str]:
        return []


def test_a_sigterm_at_any_line_of_an_image_targets_entry_leaves_no_container() -> None:
    engine = TargetEngine()

    def enter():  # type: ignore[no-untyped-def]
        target = target_module.ImageTarget("img", engine=engine, python="python3")  # type: ignore[arg-type]
        target.__enter__()
        return lambda: target.__exit__(None, None, None)

    assert _every_line(enter, lambda: engine.alive, beside_may_go=engine.beside_may_go) > 0
    assert engine.execs[-1] == (("timeout", "--help"), "beside")


class ReaderEngine:
    """The part of the engine a `status` reader's entry reaches: the image's inspect, and the
    low-level API's create and remove (by name or id, as the engine's)."""

    def __init__(self) -> None:
        self.alive: dict[str, str] = {}  # id -> name
        engine = self

        class Api:
            def create_host_config(self, **options: object) -> dict:
                return dict(options)

            def create_container(self, image_id: str, *, name: str, **options: object) -> dict:
                engine.alive[f"id-of-{name}"] = name
                return {"Id": f"id-of-{name}"}

            def remove_container(self, name_or_id: str, **options: object) -> None:
                for container_id, name in list(engine.alive.items()):
                    if name_or_id in (container_id, name):
                        del engine.alive[container_id]

        class Client:
            api = Api()

        self.client = Client()

    def image_info(self, ref: str) -> ImageInfo:
        return ImageInfo(id="sha256:" + "0" * 64, config={}, layers=1, repo_tags=(ref,))


def test_a_sigterm_at_any_line_of_a_status_readers_entry_leaves_no_container() -> None:
    engine = ReaderEngine()

    def enter():  # type: ignore[no-untyped-def]
        reader = reader_module.ImageReader("img", engine=engine)  # type: ignore[arg-type]
        reader.__enter__()
        return lambda: reader.__exit__(None, None, None)

    assert _every_line(enter, lambda: engine.alive) > 0


def test_a_sigterm_at_any_line_of_the_emulation_check_leaves_no_container() -> None:
    # Its whole life runs here, so the lines are tried from the create until the container has
    # run (its wait returned): the first lines of the way out, before the removal's hold is in
    # place (signals.py `deferred`), are a window no code can close, as for the work container's
    # exit (not tried above either); what a signal there leaves, the next run on the host
    # removes (`gc_containers`).
    class Started(Engine):
        ran = False

        def create_container(self, image_id: str, *, name: str, **options: object) -> object:
            made = super().create_container(image_id, name=name, **options)
            engine = self

            class Ran:
                def start(self) -> None:
                    pass

                def wait(self, timeout: float) -> dict:
                    engine.ran = True
                    return {"StatusCode": 0}

                def remove(self, **options: object) -> None:
                    made.remove()  # type: ignore[attr-defined]
            return Ran()

    engine = Started()

    def enter():  # type: ignore[no-untyped-def]
        engine.ran = False
        emulation_module.check_emulation(engine, "sha256:" + "0" * 64, "linux/arm64")  # type: ignore[arg-type]
        return None

    assert _every_line(enter, lambda: engine.alive, lambda: engine.alive and not engine.ran) > 0
