"""Domain errors shared by every service.

Domain code raises these (it never imports gRPC); each service's single error
interceptor maps them to a gRPC status. Anything else that escapes a handler is a
bug and becomes INTERNAL.
"""

from __future__ import annotations


class CalispecError(Exception):
    """Base class; `code` names the gRPC status (a `grpc.StatusCode` member name)."""

    code = "INTERNAL"


class InvalidArgument(CalispecError, ValueError):
    code = "INVALID_ARGUMENT"


class InvalidField(InvalidArgument):
    """One field out of its range; the message is "<field> <reason>" (`tau must be in (0, 1], got 2.0`). An API that
    names the field its own way words the refusal with `reason` (the OpenAI HTTP API's `gamma: must be in ...`)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(field, reason)  # both in args: the error pickles and copies as itself
        self.field = field
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.field} {self.reason}"


class NotFound(CalispecError, KeyError):
    code = "NOT_FOUND"

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0]) if self.args else ""


class AlreadyExists(CalispecError):
    code = "ALREADY_EXISTS"


class FailedPrecondition(CalispecError):
    code = "FAILED_PRECONDITION"


class ResourceExhausted(CalispecError):
    code = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s  # when a retry can succeed (a rate limit's refill); None: not known


# How a model service's status names a sticky CUDA error (calispec_core/grpc_server.py); the coordinator reads it
DEVICE_FAILED = "the device failed"
STOPS_SERVING = f"{DEVICE_FAILED}; this replica stops serving"  # the call that met the failure (not a refusal after)


class Unavailable(CalispecError):
    code = "UNAVAILABLE"


class DeadlineExceeded(CalispecError):
    code = "DEADLINE_EXCEEDED"


class Unauthenticated(CalispecError):
    code = "UNAUTHENTICATED"


class PermissionDenied(CalispecError):
    code = "PERMISSION_DENIED"


def require(condition: bool, message: str) -> None:
    """Raise InvalidArgument(message) unless condition holds."""
    if not condition:
        raise InvalidArgument(message)


def require_field(condition: bool, field: str, reason: str) -> None:
    """Raise InvalidField(field, reason) unless condition holds."""
    if not condition:
        raise InvalidField(field, reason)


class Cancelled(CalispecError):
    code = "CANCELLED"
