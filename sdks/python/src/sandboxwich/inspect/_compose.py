"""Docker Compose files as the ``sandboxwich`` sandbox's per-sample config:
the one service's image, pinned by digest, is the image the sample's cell
runs (its claim names it, CONTRACT §21). What a cell cannot honour is
refused with one line naming the fix, never ignored in silence.

A sterile cell is one container of one image, without network (loopback
only), whose PID 1 is the cell agent and whose memory and CPUs are its
pool's. So of a service only these are accepted:

- ``image``: required, pinned by digest (``host/repo@sha256:<64 hex>``, a tag
  beside the digest is ignored by the server);
- ``network_mode: none`` (what a cell has anyway; any other mode, and
  ``networks``, are refused);
- ``working_dir``: an absolute path, where relative paths and ``cwd``
  resolve (the provider's ``working_dir``);
- ``init``, and a keep-alive ``command``/``entrypoint`` (``tail -f
  /dev/null``, ``sleep infinity``, bare or under ``sh -c``): ignored, since
  the agent is PID 1, reaps, and keeps the cell up for its lease; any other
  command or entrypoint is refused (the cell would not run it);
- ``x-*`` extension keys: ignored (``x-sandboxwich`` belongs at the top level).

``mem_limit``, ``cpus`` and ``deploy`` (resources) are refused: a tenant
cannot read its cells' limits (``GET /v1/pools`` is the operator's and
shows none, the inventory and the evidence carry none), so they could not be
checked, and a cell silently smaller than asked for would fail the sample in
confusing ways. ``build``, several services, a tag without a digest and
every other key are refused too. At the top level, ``services``, ``name``,
``version`` and ``x-*`` are accepted; ``x-sandboxwich`` is a mapping of
sandboxwich config keys (url, token_file, release, …) validated like a
config file.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

COMPOSE_FILES = ("compose.yaml", "compose.yml", "docker-compose.yaml", "docker-compose.yml")
"""The file names of a Docker Compose file (Inspect's list)."""

PINNED = re.compile(r"[^\s@$]+@sha256:[0-9a-f]{64}")
"""An image reference pinned by digest. The server checks the rest (a pool
must run it, or an image class allow its repository)."""

PIN_FIX = "pin it: image: host/repo@sha256:<64 hex>"

_TOP = {"services", "name", "version"}
_KEEPALIVE = (["tail", "-f", "/dev/null"], ["sleep", "infinity"])
_SHELLS = ("sh", "/bin/sh", "bash", "/bin/bash")
_LIMITS = ("mem_limit", "mem_reservation", "memswap_limit", "cpus", "cpu_count", "cpu_shares", "cpu_quota", "cpuset", "deploy")
_SUPPORTED = "image (pinned by digest), network_mode: none, working_dir, init, a keep-alive command or entrypoint, x-* keys"


class ComposeError(ValueError):
    """A compose file the cell cannot honour: one line, naming the fix."""


@dataclass(frozen=True)
class ComposeSpec:
    """What a compose file gives the sample's cell."""

    image: str
    working_dir: str | None
    sandboxwich: dict[str, Any] | None
    network_none: bool = False
    """The service says ``network_mode: none``: its cell asks for no egress."""
    """The top-level ``x-sandboxwich`` mapping (config keys), if any."""


def pin_error(image: object) -> str | None:
    """Why ``image`` is not a reference pinned by digest, or None."""
    if not isinstance(image, str) or not image:
        return f"is not an image reference; {PIN_FIX}"
    if "$" in image:
        return "uses a variable; compose variables are not interpolated: write the reference pinned by digest (host/repo@sha256:<64 hex>)"
    if not PINNED.fullmatch(image):
        if "@" not in image:
            return f"is a tag without a digest; {PIN_FIX}"
        return f"is not pinned by a sha256 digest; {PIN_FIX}"
    return None


def is_compose_file(path: str) -> bool:
    return path.replace("\\", "/").rsplit("/", 1)[-1] in COMPOSE_FILES


def is_dockerfile(path: str) -> bool:
    """Inspect's rule: ``Dockerfile``, ``Dockerfile.name`` or ``name.Dockerfile``."""
    name = path.replace("\\", "/").rsplit("/", 1)[-1]
    return name == "Dockerfile" or name.startswith("Dockerfile.") or name.endswith(".Dockerfile")


def _keepalive(v: object) -> bool:
    """Whether a command or entrypoint only keeps a container up."""
    if v is None or v == "" or v == []:
        return True
    if isinstance(v, str):
        try:
            argv = shlex.split(v)
        except ValueError:
            return False
    elif isinstance(v, list) and all(isinstance(a, str) for a in v):
        argv = list(v)
    else:
        return False
    if argv and argv[0] == "exec":
        argv = argv[1:]
    if len(argv) == 3 and argv[0] in _SHELLS and argv[1] == "-c":
        return _keepalive(argv[2])
    return argv in _KEEPALIVE


def parse(data: object, where: str) -> ComposeSpec:
    """The cell a compose mapping describes, or ComposeError. ``where``
    names the file in messages; no value of the file is ever quoted."""
    if not isinstance(data, dict):
        raise ComposeError(f"{where}: expected a Docker Compose mapping with services:, got {type(data).__name__}")
    for k in data:
        if not isinstance(k, str) or (k not in _TOP and not k.startswith("x-")):
            raise ComposeError(
                f"{where}: top-level {str(k)!r} is not supported: a cell is one container of one image, without volumes,"
                " networks, configs or secrets; remove it"
            )
    services = data.get("services")
    if not isinstance(services, dict) or not services:
        raise ComposeError(f"{where}: no service; give exactly one service with image: host/repo@sha256:<64 hex>")
    if len(services) > 1:
        names = ", ".join(repr(str(n)) for n in services)
        raise ComposeError(f"{where}: {len(services)} services ({names}); a sample runs in one cell of one image: keep exactly one service")
    name, svc = next(iter(services.items()))
    at = f"{where}: service {str(name)!r}"
    if not isinstance(svc, dict):
        raise ComposeError(f"{at} is not a mapping; give it image: host/repo@sha256:<64 hex>")
    if "build" in svc:
        raise ComposeError(
            f"{at} has build:; cells do not build images: push the image to a registry and name it by its digest (image: host/repo@sha256:<64 hex>)"
        )
    if "image" not in svc:
        raise ComposeError(f"{at} has no image; name one pinned by digest (image: host/repo@sha256:<64 hex>)")
    why = pin_error(svc["image"])
    if why:
        raise ComposeError(f"{at} image {why}")
    working_dir = None
    network_none = False
    for k, v in svc.items():
        if not isinstance(k, str):
            raise ComposeError(f"{at}: a key is not a string; remove it")
        if k == "image" or k == "init":
            continue
        if k == "x-sandboxwich":
            raise ComposeError(f"{at}: x-sandboxwich belongs at the top level of the file, not in the service; move it")
        if k.startswith("x-"):
            continue
        if k == "network_mode":
            if v != "none":
                raise ComposeError(
                    f"{at} network_mode: a cell has loopback only, or its pool's egress allow-list;"
                    " remove it, or set network_mode: none (x-sandboxwich egress narrows the pool's list)"
                )
            network_none = True
        elif k == "networks":
            raise ComposeError(f"{at} networks: cells have no network (loopback only); remove it (network_mode: none is accepted)")
        elif k in ("command", "entrypoint"):
            if not _keepalive(v):
                raise ComposeError(
                    f"{at} {k}: cells do not run the image's {k} (the cell agent is PID 1 and every command is an exec);"
                    " remove it and run it from the task (sandbox().exec)"
                )
        elif k == "working_dir":
            if not isinstance(v, str) or not v.startswith("/"):
                raise ComposeError(f"{at} working_dir must be an absolute path")
            working_dir = v
        elif k in _LIMITS:
            raise ComposeError(
                f"{at} {k}: a cell's memory and CPUs are its pool's, and the server shows a tenant no limits to check it against"
                " (not in GET /v1/pools, the inventory or the evidence); remove it and choose a pool whose cells fit"
            )
        else:
            raise ComposeError(f"{at}: key {k!r} cannot be honoured by a sterile cell (supported: {_SUPPORTED}); remove it")
    sbw = data.get("x-sandboxwich")
    if sbw is not None and not isinstance(sbw, dict):
        raise ComposeError(f"{where}: x-sandboxwich must be a mapping of sandboxwich config keys")
    if sbw is not None and "image" in sbw:
        raise ComposeError(f"{where}: x-sandboxwich must not name an image: the image is the service's; remove it")
    if sbw is not None and working_dir is not None and "working_dir" in sbw:
        raise ComposeError(f"{where}: working_dir is given twice (the service's and x-sandboxwich's); keep one")
    if sbw is not None and network_none and sbw.get("egress"):
        raise ComposeError(f"{where}: network_mode: none and x-sandboxwich egress disagree; keep one")
    return ComposeSpec(str(svc["image"]), working_dir, sbw, network_none)
