"""Find out, before any request to the workspace, whether there is anything to authenticate with.

The SDK's `Config` asks the host for its metadata (`/.well-known/databricks-config`) before it looks for
credentials: given a host and no token, `run` would wait on that host (up to --connect-timeout) only to say that
there is nothing to authenticate with. `check_credentials` resolves the configuration as the SDK does (the profile,
DATABRICKS_* variables, ~/.databrickscfg) with every request of its own refused, and where nothing explicit is
configured runs the SDK's own default chain, whose methods then are local or have bounds of their own: a login of
the Databricks CLI, an OIDC token in the environment, a Databricks runtime. The exception is Azure CLI on an Azure
host: the SDK first asks the workspace's login page for its tenant, without a timeout, as it does in the client
proper.
"""

from __future__ import annotations

import inspect

from databricks.sdk.config import Config
from databricks.sdk.credentials_provider import CredentialsStrategy, DefaultCredentials
from requests.adapters import BaseAdapter

LOGIN_FIX = ("`databricks auth login --host https://<workspace>` (then --profile NAME), or set DATABRICKS_HOST and "
             "DATABRICKS_TOKEN, or name a profile of {config_file} with --profile NAME or DATABRICKS_CONFIG_PROFILE")


class CannotAuthenticate(RuntimeError):
    """The SDK found no usable credentials."""


class _NothingToAuthenticateWith(Exception):
    """Not a ValueError: `Config` passes it through as it is, instead of wrapping it in its own message."""

    def __init__(self, cfg: Config):
        super().__init__(_what_is_missing(cfg))
        self.config_file = cfg.config_file or "~/.databrickscfg"


class _NoRequests(BaseAdapter):
    def send(self, request, *args, **kwargs):
        raise ConnectionRefusedError(f"not sent while checking credentials: {request.method} {request.url}")

    def close(self) -> None:
        pass


def _no_headers() -> dict[str, str]:
    return {}


class _DefaultChainOffline(CredentialsStrategy):
    """The SDK's default chain where nothing explicit is configured; no headers ever come out of it."""

    def auth_type(self) -> str:
        return "default"

    def __call__(self, cfg: Config):
        if cfg.host and (cfg.is_any_auth_configured or cfg.auth_type):
            return _no_headers  # a token, a client secret, an auth type...: the client proper tries it
        try:
            DefaultCredentials()(cfg)
        except ValueError as error:
            if error.__cause__ is None:  # no method applied (one that applied and failed is chained to its error)
                raise _NothingToAuthenticateWith(cfg) from None
        return _no_headers


def _what_is_missing(cfg: Config) -> str:
    where = f" (profile {cfg.profile} of {cfg.config_file or '~/.databrickscfg'})" if cfg.profile else ""
    if cfg.host:
        return f"no token or other credentials are configured for the workspace at {cfg.host}{where}"
    if cfg.is_any_auth_configured:
        return f"credentials are configured, but no workspace host{where}"
    return f"neither a workspace host nor a token (or other credentials) is configured{where}"


def check_credentials(profile: str | None) -> None:
    """Raise `CannotAuthenticate` at once when the SDK would find nothing to authenticate with.

    Errors of the configuration itself (a profile that is not in the file, two methods at once) come out as the
    SDK's ValueError, as they do from `Config`.
    """
    if "http_adapter" not in inspect.signature(Config.__init__).parameters:
        return  # databricks-sdk before 0.120 takes no transport: its first request could not be refused
    try:
        Config(profile=profile, credentials_strategy=_DefaultChainOffline(), http_adapter=_NoRequests())
    except _NothingToAuthenticateWith as error:
        raise CannotAuthenticate(f"cannot authenticate to the workspace: {error}; fix: "
                                 + LOGIN_FIX.format(config_file=error.config_file)) from None
