"""One home for image-config knowledge and distribution names (fast tier)."""

from __future__ import annotations

from dspark_patch.distname import canonical_name, filename_name
from dspark_patch.targets.imageconfig import (
    DEFAULT_PATH,
    GO_DIR,
    GO_LINK,
    image_argv,
    image_env,
    is_dir,
    is_link,
    search_dirs,
    site_candidates,
)


def test_names_compare_by_pep_503_and_match_files_by_the_wheel_escaping() -> None:
    assert canonical_name("Foo_Bar.baz--x") == "foo-bar-baz-x" == canonical_name("foo-bar_baz.X")
    assert filename_name("Foo-Bar.baz") == "foo_bar_baz"       # vllm-0.33.0.dist-info, foo_bar/
    assert canonical_name("vLLM") == filename_name("vLLM") == "vllm"


def test_env_argv_and_path_are_read_as_the_engine_runs_a_container() -> None:
    config = {"Env": ["A=1=2", "NOVALUE", "PATH=/opt/venv/bin:relative:/usr/bin", "VIRTUAL_ENV=/v/"],
              "Entrypoint": ["/bin/tini", "--"], "Cmd": ["vllm", "serve"]}
    assert image_env(config) == {"A": "1=2", "PATH": "/opt/venv/bin:relative:/usr/bin", "VIRTUAL_ENV": "/v/"}
    assert image_argv(config) == ["/bin/tini", "--", "vllm", "serve"]
    assert image_argv({"Cmd": ["python3"]}) == ["python3"]
    assert image_argv({"Entrypoint": None, "Cmd": None}) == []
    # VIRTUAL_ENV first, PATH's absolute entries, then the usual roots; each once
    assert search_dirs(config) == ["/v/bin", "/opt/venv/bin", "/usr/bin", "/opt/conda/bin", "/venv/bin",
                                   "/usr/local/bin"]
    assert search_dirs({})[:6] == DEFAULT_PATH.split(":")


def test_go_mode_bits_say_folder_and_link() -> None:
    assert is_dir({"mode": GO_DIR | 0o755}) and not is_link({"mode": GO_DIR | 0o755})
    assert is_link({"mode": GO_LINK | 0o777}) and not is_dir({"mode": GO_LINK | 0o777})
    assert not is_dir(None) and not is_link(None) and not is_dir({"mode": 0o644})


def test_site_candidates_look_under_the_config_prefixes_then_the_usual_ones() -> None:
    folders = {"/v/lib/python3.12", "/v/lib/python3.12/site-packages", "/usr/lib/python3.11",
               "/usr/lib/python3.11/dist-packages", "/usr/lib/python3/dist-packages"}
    found = site_candidates({"Env": ["VIRTUAL_ENV=/v", "PATH=/usr/bin:/bin"]}, folders.__contains__)
    assert found == ["/v/lib/python3.12/site-packages", "/usr/lib/python3.11/dist-packages",
                     "/usr/lib/python3/dist-packages"]
