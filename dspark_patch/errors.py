"""The error tree. Every failure a user can cause or meet is one of these.

Each subclass knows its exit code; the message says what went wrong and what to do.
The CLI catches only `DsparkPatchError` and prints one line; anything else is a bug.
Exit codes: 0 success, 1 a check failed, 2 bad invocation or bad input, 3 environment problem.
"""

from __future__ import annotations

from typing import ClassVar


class DsparkPatchError(Exception):
    """Root of every error the tool reports to a user."""

    exit_code: ClassVar[int] = 1
    kind: ClassVar[str] = "error"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def line(self) -> str:
        """The one line shown to the user: the problem, then what to do."""
        return f"{self.message} ({self.hint})" if self.hint else self.message


# --- exit 1: a check failed -------------------------------------------------------------
class CheckFailed(DsparkPatchError):
    exit_code = 1
    kind = "check-failed"


class HunkDoesNotApply(CheckFailed):
    """A hunk's context or removed lines are not found exactly (zero fuzz) anywhere."""

    kind = "hunk-does-not-apply"


class PartlyApplied(CheckFailed):
    """Some hunks are already applied and others are not."""

    kind = "partly-applied"


class HashMismatch(CheckFailed):
    """A target file is not the pre-image (or post-image) the patch set knows."""

    kind = "hash-mismatch"


class UnfinishedApply(CheckFailed):
    """`apply --root`: an earlier apply of the tree was killed, and its journal cannot be finished
    or undone safely (a file it names changed since), or a dry run found it."""

    kind = "unfinished-apply"


class VerifyMismatch(CheckFailed):
    kind = "verify-mismatch"


class ModifiedBase(CheckFailed):
    """`apply`: the tree to patch is not the published wheel (another file edited, added or
    missing, a RECORD row rewritten, bytecode that is not its source's): it is not patched."""

    kind = "modified-base"


class CompileFailed(CheckFailed):
    kind = "compile-failed"


class ProbeFailed(CheckFailed):
    kind = "probe-failed"


class LayerMismatch(CheckFailed):
    """The container's changes are not exactly the expected files (would bake junk into the image)."""

    kind = "layer-mismatch"


class HostileLayer(CheckFailed):
    """A layer (or the engine's tar of a folder) that two tar readers, or an engine and this tool,
    could unpack differently: it is refused, never read into a verdict."""

    kind = "hostile-layer"


class UnreadableLayout(CheckFailed):
    """The image's files are where a read without running it cannot follow them (a symlink over
    vLLM's folders, a vLLM no interpreter of the image imports): nothing is said about them."""

    kind = "unreadable-layout"


class UnimportedCopy(CheckFailed):
    """`apply`, `verify`: the image holds the distribution in a site folder that no interpreter
    of the image imports it from (a decoy beside the one that runs, a stale second install).
    Which copy a later audit or a changed entrypoint meets is then not the patched one's to say."""

    kind = "unimported-copy"


class RunsFirst(CheckFailed):
    """`status`, `verify`, `apply`: the image, started as its config says (entrypoint, USER,
    WORKDIR, Env), imports something else before the checked distribution or runs a start-up
    hook (targets/runtime.py): what was checked is not what runs."""

    kind = "runs-first"


def runs_first_message(ref: str, distribution: str, lines: list[str]) -> RunsFirst:
    """The one error for what an image runs before its checked distribution (runtime.runs_first)."""
    return RunsFirst(f"image {ref} runs other code before the {distribution} that was checked: " + "; ".join(lines),
                     hint="remove it from the image (or from its Env/entrypoint); the verdict is about what runs")


class EvaluationFailed(CheckFailed):
    kind = "evaluation-failed"


class PortConflict(CheckFailed):
    """`port`: a hunk of the source variant does not land exactly in the target release."""

    kind = "port-conflict"


class SupersededUnproven(CheckFailed):
    """A patch set's `superseded` record names the installed release, but the release does not
    prove it: its files are not the recorded ones, or the effect cases fail there."""

    kind = "superseded-unproven"


class PortRefused(CheckFailed):
    """`port`: the target release cannot take the patch as it is (an unguarded reader)."""

    kind = "port-refused"


# --- exit 2: bad invocation or bad input ------------------------------------------------
class BadInput(DsparkPatchError):
    exit_code = 2
    kind = "bad-input"


class MalformedPatch(BadInput):
    kind = "malformed-patch"


class UnsafePatch(BadInput):
    """Binary, rename, mode-only, symlink, submodule, absolute or escaping paths, NUL bytes."""

    kind = "unsafe-patch"


class UnknownPatchSet(BadInput):
    kind = "unknown-patch-set"


class InvalidPatchSet(BadInput):
    kind = "invalid-patch-set"


class InvalidSeries(BadInput):
    """A series of patch sets that cannot be applied as listed: a set twice, one whose required
    set is missing or after it, a cycle, two sets changing one file without `requires`."""

    kind = "invalid-series"


class UnsupportedRelease(BadInput):
    kind = "unsupported-release"


class BadJournal(BadInput):
    """`apply --root`: the journal an interrupted apply left is not one this tool can trust
    (malformed, a link, a path out of the tree, a pre-image that is not its own hash)."""

    kind = "bad-journal"


class TargetNotFound(BadInput):
    """Missing path, missing image, no python or no distribution in the target."""

    kind = "target-not-found"


class TagExists(BadInput):
    kind = "tag-exists"


class StackedLayer(BadInput):
    """apply would write a second dspark-patch layer over one the image already carries: the two
    would stack, and neither patch set (nor the series) would verify on the result."""

    kind = "stacked-layer"


class TagRace(TagExists):
    """The tag was free when the run started and another run took it (or is taking it) since."""

    kind = "tag-race"


class PublishRefused(BadInput):
    """`publish` was given a layer or report that does not prove what it must about the source
    image (made from another image or release, edited, a file more or less): nothing is pushed."""

    kind = "publish-refused"


class UnreviewedVariant(BadInput):
    """The release's variant was made by `port` and no person has marked it reviewed."""

    kind = "unreviewed-variant"


class BadReference(BadInput):
    """A reference file (the user's, references/user.py) that is not one the tool can trust:
    not a regular file, too large, not the builder's gzip JSON, or spelling another wheel than
    its name. It is never skipped: what it would have checked is unchecked until it is fixed."""

    kind = "bad-reference"


# --- exit 3: environment problem --------------------------------------------------------
class EnvironmentProblem(DsparkPatchError):
    exit_code = 3
    kind = "environment"


class EngineUnreachable(EnvironmentProblem):
    kind = "engine-unreachable"


class WheelFetchFailed(EnvironmentProblem):
    """pip could not download the release's wheel (no such release, no wheel for the platform,
    the index unreachable, a hash that is not the index's)."""

    kind = "wheel-fetch-failed"


class AmbiguousDistribution(CheckFailed):
    """Two dist-info folders of the distribution in one site folder: which is installed is not decidable."""

    kind = "ambiguous-distribution"
