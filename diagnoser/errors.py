"""Errors a user can fix: each renders as one line, and the CLI exits with status 2."""


class UserError(Exception):
    """Bad input (a playbook, a config, a scenario): ``str()`` is one line to show."""


class FileFieldError(UserError):
    """A problem located in a file and, where known, a field of it."""

    def __init__(self, path: object, where: str, message: str):
        self.path, self.where, self.message = str(path), where, message
        super().__init__(f"{self.path}: {where}: {message}" if where else f"{self.path}: {message}")
