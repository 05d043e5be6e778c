"""KvikIO's remote files (HTTP, S3, WebHDFS) are not part of gdscp:
``is_remote_file_available()`` says so, and ``RemoteFile`` raises
``NotImplementedError`` (a ``RuntimeError``, which KvikIO raises when it was
built without remote file support) on any attempt to open one."""

from __future__ import annotations

from typing import Any, NoReturn

__all__ = ["RemoteFile", "is_remote_file_available"]

_MESSAGE = "gdscp does not support remote files (KvikIO's RemoteFile: HTTP, S3, WebHDFS); it reads local files"


def is_remote_file_available() -> bool:
    """False: gdscp has no remote file support."""
    return False


def _unsupported(*args: Any, **kwargs: Any) -> NoReturn:
    raise NotImplementedError(_MESSAGE)


class RemoteFile:
    """Stands for KvikIO's ``RemoteFile``: constructing one, or calling any of
    its ``open*`` class methods, raises ``NotImplementedError``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _unsupported()

    open = classmethod(_unsupported)
    open_http = classmethod(_unsupported)
    open_s3 = classmethod(_unsupported)
    open_s3_url = classmethod(_unsupported)
    open_s3_public = classmethod(_unsupported)
    open_s3_presigned_url = classmethod(_unsupported)
    open_webhdfs = classmethod(_unsupported)
