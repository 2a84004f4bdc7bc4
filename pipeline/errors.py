"""One exception hierarchy; each class also inherits the builtin a caller would expect."""

from __future__ import annotations

from typing import Any

from pipeline.sensitive.text import redact_url


class PipelineError(Exception):
    """Base class. ``exit_code`` is what the CLI returns for it."""

    exit_code = 2

    def __str__(self) -> str:
        """The message with any URL's password or signature shown as ``***`` (a notebook
        prints it as it is raised, not through the CLI's scrubbing)."""
        return redact_url(super().__str__())


class UsageError(PipelineError, ValueError):
    """A bad option or argument value."""


class ArgumentTypeError(UsageError, TypeError):
    """An argument of the wrong type (the API's A, B or OUT given as something else)."""


class InputNotFoundError(PipelineError, FileNotFoundError):
    """An input path or URL holds no Zarr array."""


COPY_FOLDER_PREFIX = "tilegemm-in-memory-"
"""The name of a temporary folder holding copies of a job's arrays in memory starts so
(pipeline.store.in_memory): a worker that cannot read one is told to use storage it reaches."""


class InputUnreachableError(InputNotFoundError):
    """A worker cannot open an input this machine opened: it sees other files (no shared file
    system, another working folder) or may not read them."""

    def __init__(self, url: str, worker: str, reason: str, name: str = "", then: str = "") -> None:
        self.url = url
        """The input as the job gave it to the workers."""
        self.worker = worker
        """The worker's address ("" when not known)."""
        self.reason = reason
        """What the worker found: "it does not exist there", "permission denied on ..."."""
        self.name = name
        """The input's name in the command (A, B, C, X; "" until the caller names it)."""
        self.then = then
        """The end of the fix: what to run once the workers can read it."""
        who = f"{name} ({url})" if name else url
        where = f"a worker ({worker})" if worker else "a worker"
        target = url.rsplit("::", 1)[-1]  # a chained URL's (zip://A::a.zip) file or URL
        fix = (
            "it is an array in memory that this machine copied to its temporary folder for the "
            "job, which the workers do not share: write the array to Zarr on storage they can "
            "read (e.g. zarr.create_array('s3://bucket/a.zarr', data=array)) and pass that URL"
            if COPY_FOLDER_PREFIX in target
            else "the workers must see the same paths as this machine (a shared file system), "
            "or use a URL they can reach"
            if "://" not in target
            else "the workers must reach the same storage: check their network and credentials"
        )
        super().__init__(f"{where} cannot read {who}: {reason}; {fix}{then}")

    def named(self, name: str, then: str = "") -> InputUnreachableError:
        return InputUnreachableError(self.url, self.worker, self.reason, name, then)

    def __reduce__(self) -> tuple[Any, ...]:  # pickled from worker to client whole
        return (type(self), (self.url, self.worker, self.reason, self.name, self.then))


class InputError(PipelineError, ValueError):
    """An input array exists but cannot be multiplied (rank, dtype, shape)."""


class ChunkSizeError(InputError):
    """A stored chunk declares more (or fewer) bytes than its shape holds: refused undecoded."""

    def __init__(self, message: str, declared: int | None, expected: int) -> None:
        super().__init__(message)
        self.declared = declared
        """Bytes the chunk's frames declare (None: they declare none)."""
        self.expected = expected
        """Bytes the chunk's shape and dtype hold."""

    def __reduce__(self) -> tuple[Any, ...]:  # pickled from worker to client whole
        return (type(self), (str(self), self.declared, self.expected))


class StoredObjectError(InputError):
    """Where an input's chunk or metadata document should be, its store holds something no
    Zarr array stores there (a FIFO, a device, a socket, a folder) or a file larger than that
    object can need: refused unread."""

    def __init__(self, message: str, key: str, found: str) -> None:
        super().__init__(message)
        self.key = key
        """The object's key in its store (``c/0/0``, ``zarr.json``)."""
        self.found = found
        """What is there instead: "a FIFO", "a 3.0 GiB file where at most 1.0 MiB can be
        needed"."""

    def __reduce__(self) -> tuple[Any, ...]:  # pickled from worker to client whole
        return (type(self), (str(self), self.key, self.found))


class IntegerOverflowError(InputError, OverflowError):
    """An integer product's worst case does not fit OUT's dtype (refused before any work)."""


class UnfinishedOutputError(InputError):
    """``verify`` was given an OUT whose multiply has not finished (finish it with --resume)."""


class OutputExistsError(PipelineError, FileExistsError):
    """OUT exists and neither --overwrite nor --resume was given."""


class UnsafeOutputError(PipelineError, ValueError):
    """Writing OUT would touch an input or something this tool did not write."""


class MemoryBudgetError(PipelineError, ValueError):
    """No plan fits the memory budget."""


class PlanLimitError(PipelineError, ValueError):
    """The plan needs more tasks, or more K panels per task, than the configured limit."""


class BackendUnavailableError(PipelineError, RuntimeError):
    """The requested compute backend cannot run on the workers."""


class ClusterError(PipelineError, ConnectionError):
    """The scheduler cannot be reached or has no workers."""


class NotASchedulerError(ClusterError, UsageError):
    """The scheduler address (or scheduler file) leads to something that answers, but not as
    a Dask scheduler does: another service, or a Dask worker."""


class OutputUnreachableError(PipelineError, FileNotFoundError):
    """A worker cannot see OUT, which this machine created: it sees other files (no shared
    file system, another mount) or may not open them."""


class MissingPackageError(PipelineError, ModuleNotFoundError):
    """An optional package that a call needs is not installed (the message says which)."""


class JobError(PipelineError, RuntimeError):
    """The job started but failed."""

    exit_code = 1


class DeviceFaultError(JobError):
    """A CUDA error in a task: the worker's CUDA context may be lost (errors such as an
    illegal address are sticky), so the job stops and that worker is restarted."""

    def __init__(self, message: str, worker: str) -> None:
        super().__init__(message)
        self.worker = worker
        """The address of the worker whose device faulted ("" when not on a worker)."""

    def __reduce__(self) -> tuple[Any, ...]:  # pickled from worker to client whole
        return (type(self), (str(self), self.worker))


class VerificationError(PipelineError, ArithmeticError):
    """The product does not match A @ B within tolerance."""

    exit_code = 1


def storage_problem(error: BaseException, storage_options: dict[str, Any] | None) -> str | None:
    """What to tell the user when ``error`` means the storage cannot be reached (missing
    credentials, a dead endpoint); None for any other error. By class name: botocore's
    exceptions are not builtins, and s3fs may not be installed."""
    names = {cls.__name__ for cls in type(error).__mro__}
    if names & {"NoCredentialsError", "PartialCredentialsError", "ProfileNotFound"}:
        return (
            f"no S3 credentials were found ({error}); set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), pass --storage-option key=... "
            "--storage-option secret=..., or --storage-option anon=true for a public bucket"
        )
    if names & {"ConnectionError", "TimeoutError", "ConnectTimeoutError", "ReadTimeoutError"}:
        endpoint = (storage_options or {}).get("endpoint_url", "the default endpoint")
        return (
            f"the storage at {endpoint} did not answer ({type(error).__name__}: {error}); "
            "check --storage-option endpoint_url and that the server is up"
        )
    return None
