"""ocrd's version: the installed package's, or a marker when run from a source tree."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("inbox-ocrd")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+source"
