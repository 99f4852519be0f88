"""The one error type of configuration: a flag (or a config field) that cannot be served as given.

Defined apart from server_args.py so that the modules resolving the configuration (model source, model
config, the resolve step) can raise it without importing the flag parser."""


class ServerArgsError(ValueError):
    """A flag has a bad value, or the model/device cannot serve it. The message always names the flag."""
