"""README.md says what the command line is (fast tier): its command table lists exactly the
commands `dspark-patch --help` lists (a group's subcommands by their full names), every option
it shows belongs to the command it is shown with, and `.ci/run` runs the test command it names."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer.main

from dspark_patch.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PROGRAM = "dspark-patch"
_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
_SPAN = re.compile(r"`([^`\n]+)`")


def cli_commands(group: Any = None, prefix: str = "") -> dict[str, Any]:
    """Every command the CLI offers, by full name (`report merge`), as its help lists them."""
    group = group if group is not None else typer.main.get_command(app)
    found: dict[str, Any] = {}
    for name, command in group.commands.items():
        if command.hidden:
            continue
        full = f"{prefix}{name}"
        if hasattr(command, "commands"):
            found.update(cli_commands(command, f"{full} "))
        else:
            found[full] = command
    return found


def options_of(command: Any) -> set[str]:
    return {"--help"} | {opt for p in command.params if p.param_type_name == "option"
                         for opt in (*p.opts, *p.secondary_opts) if opt.startswith("--")}


def table_rows(text: str) -> list[tuple[str, str]]:
    """(command, the rest of the row) for each row of the table under `## Commands`."""
    section = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if len(cells) >= 2 and cells[0].startswith(f"`{PROGRAM} "):
            rows.append((cells[0].strip("`").removeprefix(f"{PROGRAM} "), " | ".join(cells[1:])))
    return rows


def shown_commands(text: str) -> list[str]:
    """What the README shows as code: each fenced line (a trailing `\\` joins the next) and each
    inline code span outside the fences."""
    shown: list[str] = []
    prose: list[str] = []
    for i, part in enumerate(text.split("```")):
        if i % 2:
            shown += [line.strip() for line in part.replace("\\\n", " ").splitlines() if line.strip()]
        else:
            prose.append(part)
    return shown + _SPAN.findall("\n".join(prose))


def misplaced_options(text: str, commands: dict[str, Any]) -> list[str]:
    """Options the README shows with a command that does not have them. A span that starts with
    `dspark-patch` or a command name is held to that command; an option alone in a table row to
    the row's command; an option alone elsewhere to some command."""
    every = set().union(*(options_of(c) for c in commands.values()), options_of(typer.main.get_command(app)))
    wrong: list[str] = []

    def named(span: str) -> str | None:
        words = span.replace("\\|", "|").split()
        if words and words[0] == PROGRAM:
            words = words[1:]
            if not words or words[0].startswith("-"):
                return ""   # the program's own options (--version)
        for size in (2, 1):
            if len(words) >= size and " ".join(words[:size]) in commands:
                return " ".join(words[:size])
        return None

    def check(span: str, allowed: set[str], where: str) -> None:
        wrong.extend(f"{opt} ({where}: {span!r})" for opt in _OPTION.findall(span) if opt not in allowed)

    for span in shown_commands(text):
        command = named(span)
        if command == "":
            check(span, options_of(typer.main.get_command(app)), PROGRAM)
        elif command is not None:
            check(span, options_of(commands[command]), command)
        elif span.startswith("--"):
            check(span, every, "any command")
        elif span.split()[0] == PROGRAM and not span.split()[1].isupper():   # `dspark-patch COMMAND`
            wrong.append(f"no such command: {span!r}")
    for command, rest in table_rows(text):
        for span in _SPAN.findall(rest):
            if span.startswith("--"):
                check(span, options_of(commands[command]) if command in commands else every, f"{command}'s row")
    return wrong


def test_the_command_table_lists_exactly_the_cli_s_commands() -> None:
    listed = [command for command, _ in table_rows(README.read_text(encoding="utf-8"))]
    assert len(listed) == len(set(listed)), "a command is listed twice"
    offered = set(cli_commands())
    assert {"not in the table": sorted(offered - set(listed)), "not a command": sorted(set(listed) - offered)} == {
        "not in the table": [], "not a command": []}


def test_every_option_the_readme_shows_is_one_its_command_has() -> None:
    assert misplaced_options(README.read_text(encoding="utf-8"), cli_commands()) == []


def test_ci_runs_the_readme_s_test_command() -> None:
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Set up and test a checkout\n", 1)[1].split("\n## ", 1)[0]
    # The two commands a newcomer runs on a fresh machine: the main job, then the test command.
    commands = [line.split("#", 1)[0].strip() for line in section.split("```")[1].strip().splitlines()]
    assert commands == ["scripts/demo", "scripts/test"]
    assert "the test command: CI runs exactly this" in section
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^exec scripts/test(\s|$)", ci, re.MULTILINE)


def test_the_checks_see_a_missing_row_and_a_stray_option() -> None:
    # What the checks above rest on, on a README of our own: a renamed row and an option of
    # another command are seen, in a table row and in a code span.
    commands = cli_commands()
    assert {"apply", "report merge", "report render", "kv-compare"} <= set(commands)
    table = "".join(f"| `{PROGRAM} {name}` | what it does |\n" for name in commands)
    text = f"# x\n\n## Commands\n\n| Command | What it does |\n|---|---|\n{table}\n## Next\n"
    assert sorted(c for c, _ in table_rows(text)) == sorted(commands)
    renamed = text.replace(f"`{PROGRAM} gc`", f"`{PROGRAM} collect`")
    assert sorted(c for c, _ in table_rows(renamed)) != sorted(commands)
    assert misplaced_options(text, commands) == []
    stray = (text.replace(f"`{PROGRAM} list` | ", f"`{PROGRAM} list` | `--via layers` ")
             + f"`{PROGRAM} probe --tag NAME` `{PROGRAM} vet --image REF` `{PROGRAM} COMMAND --help`\n")
    assert misplaced_options(stray, commands) == [
        "--tag (probe: 'dspark-patch probe --tag NAME')", "no such command: 'dspark-patch vet --image REF'",
        "--via (list's row: '--via layers')"]
