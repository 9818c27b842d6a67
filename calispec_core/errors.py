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


class Cancelled(CalispecError):
    code = "CANCELLED"
