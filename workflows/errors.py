"""What a person reads when a run stops: one `eyas:` paragraph and an exit code.

    2  bad input: config, layout, target, data records, a file that is not what it should be
    1  a check that ran and failed: the skew doctor, parity, losslessness, a diverged loss
   75  workers lost (a node died, a process killed) more often than Ray's restarts allow:
       everything finished is kept and the same command resumes (sysexits' EX_TEMPFAIL)

An error raised in a Ray task, actor or Ray Train worker reaches the driver wrapped (and its
traceback printed into the message); `explain` finds eyas's own error inside and prints only
its message. Anything else is a bug and keeps its traceback. With `--debug` (or EYAS_DEBUG=1)
the traceback is printed for eyas's errors too.
"""
from __future__ import annotations

import sys
import textwrap
import traceback

from eyas.conversations.prepare import NoUsableSamples, TokenizerMismatchError
from eyas.conversations.records import BadRecordError, InvalidRecord
from eyas.draft.vocab import VocabError
from eyas.doctor.verdict import SkewAlarm
from eyas.extract import ExtractError
from eyas.files import DISK_ERRNOS
from eyas.progress import verbose
from eyas.store.format import DatasetFormatError
from eyas.layout import LayoutError
from eyas.serve.parity import ParityError
from eyas.engines.vllm_engine import EngineUnavailable
from eyas.targets import TargetError
from eyas.train.loop import CheckpointError, TrainingError
from workflows.config import ConfigError
from workflows.stages import StageFailed
from tasks.cluster import StorageNotShared

BAD_INPUT, FAILED_CHECK, LOST = 2, 1, 75
_BAD_INPUT = (ConfigError, LayoutError, TargetError, BadRecordError, InvalidRecord,
              TokenizerMismatchError, VocabError, DatasetFormatError, ExtractError,
              EngineUnavailable, FileNotFoundError, NoUsableSamples, CheckpointError,
              StorageNotShared)
_FAILED_CHECK = (StageFailed, SkewAlarm, ParityError, TrainingError)


def debug_requested(argv: list[str]) -> tuple[bool, list[str]]:
    """(--debug or debug=true given, or EYAS_DEBUG set; argv without them)."""
    rest = [a for a in argv if a not in ("--debug", "debug=true")]
    return len(rest) != len(argv) or verbose(), rest


def _inner(exc: BaseException) -> list[BaseException]:
    """The errors a Ray or Ray Train wrapper carries (task cause, worker failures, chain)."""
    inner = [getattr(exc, "cause", None), getattr(exc, "controller_failure", None),
             *(getattr(exc, "worker_failures", None) or {}).values(),
             getattr(exc, "health_check_failure", None), exc.__cause__]
    return [e for e in inner if isinstance(e, BaseException) and e is not exc]


def _first(exc: BaseException, match) -> BaseException | None:
    """The first error inside `exc` (itself included, breadth first) that `match`es."""
    queue, seen = [exc], set()
    while queue:
        e = queue.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        if match(e):
            return e
        queue.extend(_inner(e))
    return None


def find_eyas_error(exc: BaseException) -> BaseException | None:
    """eyas's own error, however deep inside Ray's wrappers."""
    return _first(exc, lambda e: (isinstance(e, _BAD_INPUT + _FAILED_CHECK) or _disk_error(e))
                  and not _is_ray_wrapper(e))


# Ray's errors for a worker, actor or node that died; a Ray Train worker group fails with them
# (or with the collective's broken connection beside them) once its restarts are spent
_DIED = ("ActorDiedError", "RayActorError", "NodeDiedError", "WorkerCrashedError",
         "OwnerDiedError", "ObjectLostError", "ActorUnavailableError",
         "WorkerHealthCheckFailedError")


def lost_worker(exc: BaseException) -> BaseException | None:
    """The death of a worker, actor or node inside `exc`, however deep (None when the failure
    is something else: a bug keeps its traceback)."""
    return _first(exc, lambda e: any(c.__name__ in _DIED for c in type(e).__mro__))


def _is_ray_wrapper(e: BaseException) -> bool:
    """Ray re-raises a task's error as a class deriving from both RayTaskError and it."""
    return any(c.__name__ in ("RayTaskError", "RayActorError") for c in type(e).__mro__)


def _disk_error(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in DISK_ERRNOS


def _message(e: BaseException) -> str:
    if isinstance(e, FileNotFoundError) and e.filename:
        return f"{e.filename}: no such file or directory"
    if _disk_error(e):
        where = e.filename or "a file of the run"
        return (f"{where}: {e.strerror.lower()} (errno {e.errno}). Files are written under a "
                "temporary name and renamed when complete, so every stage and shard finished "
                "before is intact and none is half-written: free space and run the same command "
                "again (finished stages and shards are not redone), or give run_dir another disk")
    return str(e).strip()


def explain(exc: BaseException, debug: bool = False, stream=None) -> int:
    """Print the paragraph for `exc`; return the exit code. Unknown errors re-raise."""
    stream = stream or sys.stderr
    found = find_eyas_error(exc)
    if found is None:
        died = lost_worker(exc)
        if died is None:
            raise exc
        if debug:
            traceback.print_exception(exc, file=stream)
        what = str(died).strip().splitlines()
        print(textwrap.fill(
            "eyas: a worker died more often than Ray's restarts allow (a node lost, a process "
            f"killed): {type(died).__name__}{': ' + what[-1] if what else ''}. Every finished "
            "stage, shard and training checkpoint is kept: run the same command to resume",
            width=100, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False),
            file=stream)
        return LOST
    if debug:
        traceback.print_exception(exc, file=stream)
    text = _message(found)
    first, _, rest = text.partition("\n")
    paragraph = textwrap.fill(f"eyas: {first}", width=100, subsequent_indent="  ",
                              break_long_words=False, break_on_hyphens=False)
    if rest:  # a verdict or table keeps its own lines
        paragraph += "\n" + textwrap.indent(rest, "  ")
    if not debug:
        paragraph += "\n  (--debug shows the traceback)"
    print(paragraph, file=stream)
    return FAILED_CHECK if isinstance(found, _FAILED_CHECK) else BAD_INPUT
