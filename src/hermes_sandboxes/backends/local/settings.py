"""Settings of the local backend: the portable spec keys plus where the store lives and what the
sandboxes are built on. Used by the CLI's config file (``[local]``) and by the Hermes plugin
``sandbox`` (``plugins.entries.sandbox.settings``). Imports nothing of the backend itself."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hermes_sandboxes.backends.local.paths import base_problem
from hermes_sandboxes.egress.broker import DEFAULT_HEADERS, BrokeredCredential
from hermes_sandboxes.errors import InvalidInput
from hermes_sandboxes.settings import SpecSettings, absolute_path, absolute_paths

DEFAULT_STORE_HOME = "/var/lib/hermes-sandboxes"
STORE_HOME_ENV = "HERMES_SANDBOXES_HOME"


class Brokered(BaseModel):
    """One brokered credential: the hosts it is for and where its value is on the host (``env``: a
    variable of the process that starts the sandbox, or under the Hermes plugin a secret of the
    active profile; ``file``: an absolute path; ``headers``: the request headers the proxy may put
    it into, ``Authorization`` by default). There is no key for the value itself: a secret never
    sits in a settings file."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    hosts: tuple[str, ...]
    env: str | None = None
    file: str | None = None
    headers: tuple[str, ...] = DEFAULT_HEADERS  # the request headers the secret may go into


class LocalSettings(SpecSettings):
    """``home``: the store directory (else $HERMES_SANDBOXES_HOME, else /var/lib/hermes-sandboxes for
    root and ~/.local/share/hermes-sandboxes for anyone else);
    ``base``: a root filesystem directory new sandboxes are built on (default the host's /);
    ``masks``: more host paths to hide inside; ``brokered``: credentials the egress proxy of
    ``proxy`` sandboxes adds to requests, by the variable name commands see a placeholder in;
    ``upstream_ca``: a CA bundle that proxy trusts for servers instead of the system's."""

    backend: Literal["local"] = "local"
    base: str | None = None
    masks: tuple[str, ...] = ()
    home: str | None = None
    brokered: dict[str, Brokered] = Field(default_factory=dict)
    upstream_ca: str | None = None

    @field_validator("upstream_ca", mode="before")
    @classmethod
    def _upstream_ca(cls, value: object) -> str:
        return absolute_path(value, "an absolute path to a PEM file of CA certificates")

    @field_validator("brokered", mode="after")
    @classmethod
    def _brokered(cls, value: dict[str, Brokered]) -> dict[str, Brokered]:
        try:
            _credentials(value)
        except InvalidInput as exc:
            raise ValueError(str(exc)) from None
        return value

    def brokered_credentials(self) -> tuple[BrokeredCredential, ...]:
        return _credentials(self.brokered)

    @field_validator("home", mode="before")
    @classmethod
    def _directory(cls, value: object) -> str:
        return absolute_path(value, "an absolute directory path")

    @field_validator("base", mode="before")
    @classmethod
    def _base(cls, value: object) -> str:
        text = absolute_path(value, "an absolute directory path")
        problem = base_problem(text)
        if problem is not None:
            raise ValueError(problem)
        return text

    @field_validator("cpus", mode="after")
    @classmethod
    def _host_cores(cls, value: float | None) -> float | None:
        cores = os.cpu_count() or 1
        if value is not None and value > cores:
            raise ValueError(f"got {value:g}; this machine has {cores} cores, so at most {cores} can be given")
        return value

    @field_validator("masks", mode="before")
    @classmethod
    def _masks(cls, value: object) -> tuple[str, ...]:
        return absolute_paths(value)

    def store_home(self) -> Path:
        from hermes_sandboxes.backends.local import paths

        return Path(self.home or os.environ.get(STORE_HOME_ENV) or paths.default_home())


def _credentials(brokered: dict[str, Brokered]) -> tuple[BrokeredCredential, ...]:
    return tuple(BrokeredCredential(name=name, hosts=b.hosts, env=b.env, file=b.file, headers=b.headers)
                 for name, b in brokered.items())
