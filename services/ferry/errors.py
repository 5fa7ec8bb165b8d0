"""Ferry's one exception hierarchy.

Redis and gRPC errors are translated into these at the adapter boundary; whether a failure is worth
retrying is decided here, by the class, and nowhere else.
"""


class FerryError(Exception):
    """Base of every error Ferry raises on purpose."""


class StartupError(FerryError):
    """A process or dependency could not be started or reached at start-up."""


class ConfigError(FerryError):
    """A setting has a value Ferry cannot use."""


class BadRequestError(FerryError):
    """A client sent something Ferry will not enqueue; ``code`` names the problem."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


class DependencyUnavailableError(FerryError):
    """Redis or Triton cannot be reached right now (the request may succeed later)."""


class BackendError(FerryError):
    """An inference call failed."""

    transient = False


class TransientBackendError(BackendError):
    """Worth retrying the same call: the server was unreachable, overloaded or timed out."""

    transient = True


class PermanentBackendError(BackendError):
    """The server answered and refused the call: retrying the same batch will fail again."""


class ModelContractError(PermanentBackendError):
    """The model does not follow Ferry's model contract (one BYTES input of dims [1], batched)."""


class UnknownModelError(PermanentBackendError):
    """Triton does not serve a model of that name (or it is not ready)."""
