"""The config's one error."""

from ddmq.protocol.errors import DdmqError


class ConfigError(DdmqError):
    """A config file could not be loaded; the message names the file and the bad field's path."""

    retriable = False  # the same file fails the same way until someone edits it
