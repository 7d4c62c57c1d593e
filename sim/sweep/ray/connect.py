"""Connecting a sweep to Ray: a local instance, or the cluster at ``--address``, failing fast with one line.

Before ``ray.init`` touches a cluster address, this module checks it itself, each step bounded in time (about
30 s in all, ``CONNECT_TIMEOUT_S``), so that a wrong address is an exit-2 line naming ``--address`` and the cause
rather than minutes of Ray's log lines:

1. the address: ``HOST:PORT`` (the GCS port that ``ray start --head --port`` opened), ``auto`` (the cluster started
   on this machine) or ``ray://HOST:PORT`` (Ray Client); ``$RAY_ADDRESS`` when ``--address`` is not given;
2. a TCP connection to it (refused, unknown host, unreachable, timed out), then the gRPC handshake that a GCS
   answers (something else listening there);
3. token authentication (``ray start`` turns it on when a token exists): one request to the GCS without a token
   tells whether the cluster wants one; if so, token mode is turned on for this process (``RAY_AUTH_MODE=token``,
   the token from ``RAY_AUTH_TOKEN``, the file ``RAY_AUTH_TOKEN_PATH`` names, or ``~/.ray/auth_token``) and a
   second request checks the token. No token, or not the cluster's: one line saying what to copy or set. The
   driver always matches the cluster (``RAY_AUTH_MODE`` is set to what it uses): a driver in token mode beside a
   cluster without authentication gets its objects reported lost (OwnerDiedError);
4. ``ray.init`` itself, under what is left of the time limit (past it, the sweep exits 2 with one line).

``describe`` is the one line saying which cluster the sweep runs on (nodes, CPUs, authentication).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from moebase.errors import ConfigError

CONNECT_TIMEOUT_S = 30.0  # the whole connection, probes and ray.init together
PROBE_TIMEOUT_S = 5.0  # one TCP connection or handshake
WHERE = "--address"
DRIVER_HINT = (
    "run the sweep on a node of the cluster, e.g. the head, with the same Ray and Python versions, "
    "or give ray://HEAD:10001 to go through Ray Client"
)
AUTH_MODE, AUTH_TOKEN, AUTH_TOKEN_PATH = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
#: What a gRPC (HTTP/2) client sends first: the connection preface and an empty SETTINGS frame.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_SETTINGS = 0x04
_HOST_PORT = re.compile(r"^(?P<host>\[[0-9a-fA-F:.]+\]|[^\s:/\[\]]+):(?P<port>[0-9]{1,5})$")
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")  # one label of a host name (RFC 1123), ASCII only
MAX_ADDRESS_CHARS = 300
MAX_HOST_CHARS = 253


@dataclass(frozen=True)
class Address:
    """A cluster address: ``HOST:PORT`` of its GCS, or of a Ray Client server (``client``)."""

    host: str
    port: int
    client: bool = False

    def __str__(self) -> str:
        return f"{'ray://' if self.client else ''}{self.host}:{self.port}"


@dataclass(frozen=True)
class Cluster:
    """The Ray cluster a sweep runs on: its address (None: a local instance), alive nodes, CPUs, authentication
    in words."""

    address: str | None
    nodes: int
    cpus: int
    auth: str

    def describe(self) -> str:
        where = f"the Ray cluster at {self.address}" if self.address else "a local Ray instance"
        auth = f", {self.auth}" if self.auth else ""
        return f"ray: running on {where}: {self.nodes} node(s), {self.cpus} CPU(s){auth}"


# --------------------------------------------------------------------------------------------- the address
def parse_address(text: str, where: str = WHERE) -> Address:
    """``HOST:PORT``, ``ray://HOST:PORT`` or ``auto`` (the cluster last started on this machine). HOST is an IP
    address (IPv6 in brackets) or an ASCII host name (labels of at most 63 letters, digits and hyphens, 253
    characters in all), PORT 1 to 65535; anything else is a ConfigError naming ``where``, before any lookup."""
    text = (text or "").strip() if isinstance(text, str) else ""
    if text == "auto":
        return _local_cluster_address()
    client = text.startswith("ray://")
    m = _HOST_PORT.match(text.removeprefix("ray://")) if len(text) <= MAX_ADDRESS_CHARS else None
    if not m or not 0 < int(m["port"]) < 65536 or not _valid_host(m["host"]):
        raise ConfigError(
            where,
            f"expected HOST:PORT (the head node's GCS port, e.g. 10.0.0.1:6379), "
            f"ray://HOST:PORT or auto, got {_show(text)}",
        )
    return Address(m["host"].strip("[]"), int(m["port"]), client)


def check_address(text: str, where: str = WHERE) -> None:
    """The form of an address (see :func:`parse_address`), checked without Ray and without the network."""
    if isinstance(text, str) and text.strip() == "auto":
        return
    parse_address(text, where)


def _valid_host(host: str) -> bool:
    if host.startswith("["):
        try:
            return ipaddress.ip_address(host[1:-1]).version == 6
        except ValueError:
            return False
    if len(host) > MAX_HOST_CHARS:
        return False
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return all(_LABEL.match(label) for label in host.removesuffix(".").split("."))


def _show(text: str) -> str:
    return repr(text) if len(text) <= 60 else f"{text[:60]!r}... ({len(text)} characters)"


def _local_cluster_address() -> Address:
    try:
        from ray._private.utils import read_ray_address  # private: where `ray start` records the address

        found = read_ray_address()
    except Exception:  # noqa: BLE001 - another Ray version: no such helper
        found = None
    if not found:
        raise ConfigError(
            WHERE,
            "auto: no Ray cluster was started on this machine (start one with "
            "`ray start --head --port 6379`, or give HOST:PORT)",
        )
    return parse_address(found)


def probe(addr: Address, timeout: float = PROBE_TIMEOUT_S) -> None:
    """A TCP connection to ``addr`` and a gRPC handshake; ConfigError naming the cause when either fails."""
    try:
        infos = _bounded(
            lambda: socket.getaddrinfo(addr.host, addr.port, type=socket.SOCK_STREAM),
            timeout,
            f"the name lookup of {addr.host!r}",
        )
    except socket.gaierror as exc:
        raise ConfigError(WHERE, f"{addr}: unknown host {addr.host!r} ({exc.strerror})") from None
    why = "no address"
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.settimeout(timeout)
                s.connect(sockaddr)
                if os.environ.get("RAY_USE_TLS", "0") not in ("1", "true"):
                    _handshake(s, addr, timeout)
                return
        except ConnectionRefusedError:
            why = "connection refused (is `ray start --head` running there, with this port?)"
        except TimeoutError:
            why = f"no answer within {timeout:g} s (a firewall, or the wrong host?)"
        except OSError as exc:
            why = exc.strerror or str(exc)
    raise ConfigError(WHERE, f"cannot reach a Ray cluster at {addr}: {why}")


def _handshake(s: socket.socket, addr: Address, timeout: float) -> None:
    """A gRPC server answers the HTTP/2 preface with a SETTINGS frame; anything else is not a Ray GCS."""
    s.sendall(_H2_PREFACE)
    head, t0 = b"", time.monotonic()
    while len(head) < 9 and time.monotonic() - t0 < timeout:
        chunk = s.recv(9 - len(head))
        if not chunk:
            break
        head += chunk
    if len(head) < 9 or head[3] != _SETTINGS:
        what = "Ray Client server" if addr.client else "Ray GCS (the port of `ray start --head --port`)"
        raise ConfigError(WHERE, f"{addr}: something listens there, but it is not a {what}")


# --------------------------------------------------------------------------------------------- authentication
def token_source(env=os.environ) -> str | None:
    """Where this process would read a Ray auth token from (None: nowhere)."""
    if env.get(AUTH_TOKEN, "").strip():
        return AUTH_TOKEN
    if env.get(AUTH_TOKEN_PATH):
        path = Path(env[AUTH_TOKEN_PATH]).expanduser()
        return str(path) if path.is_file() else None
    default = Path(env["HOME"] if env.get("HOME") else Path.home()) / ".ray" / "auth_token"
    return "~/.ray/auth_token" if default.is_file() else None


def token_setup(env=os.environ) -> str | None:
    """Where the token comes from (None: no token); ConfigError when the environment asks for a token that is
    not there."""
    source = token_source(env)
    if env.get(AUTH_TOKEN_PATH) and source is None and not env.get(AUTH_TOKEN, "").strip():
        raise ConfigError(
            WHERE,
            f"{AUTH_TOKEN_PATH} names {env[AUTH_TOKEN_PATH]}, which is not a file: copy the "
            f"head node's ~/.ray/auth_token there",
        )
    if (env.get(AUTH_MODE) or "").strip().lower() == "token" and source is None:
        raise ConfigError(
            WHERE,
            f"{AUTH_MODE}=token but no token here: copy the head node's ~/.ray/auth_token to "
            f"~/.ray/auth_token on this machine (or set {AUTH_TOKEN_PATH}=FILE or "
            f"{AUTH_TOKEN}=TOKEN)",
        )
    return source


def prepare_auth(env=os.environ) -> str:
    """Without a GCS to ask (Ray Client): Ray's own rule for a cluster it finds by itself, token mode when a token
    is at hand and ``RAY_AUTH_MODE`` is not set (``env`` is changed). Returns the authentication in words."""
    source = token_setup(env)
    if not env.get(AUTH_MODE) and source:
        _set_mode("token", env)
    return _in_words(env, source)


def negotiate_auth(addr: Address, timeout: float, env=os.environ) -> str:
    """Match the authentication of the cluster at ``addr``: ask its GCS without a token first; if it wants one,
    turn token mode on (``env`` is changed) and ask again. Driver and cluster must agree: a driver in token mode
    beside a cluster without it gets its objects reported lost. ConfigError, saying what to set, when the
    cluster refuses. Returns the authentication in words."""
    source = token_setup(env)
    if not _have_gcs_client():
        return prepare_auth(env)
    _set_mode("disabled", env)
    if _gcs_accepts(addr, timeout):
        return "no authentication"
    if source is None:
        raise ConfigError(
            WHERE,
            f"the Ray cluster at {addr} uses token authentication and this machine has no "
            f"token: copy the head node's ~/.ray/auth_token to ~/.ray/auth_token here (or "
            f"set {AUTH_TOKEN_PATH}=FILE or {AUTH_TOKEN}=TOKEN)",
        )
    _set_mode("token", env)
    if not _gcs_accepts(addr, timeout):
        raise ConfigError(
            WHERE,
            f"the Ray cluster at {addr} refused the token from {source}: it is not the "
            f"cluster's; copy the head node's ~/.ray/auth_token",
        )
    return _in_words(env, source)


def _in_words(env, source: str | None) -> str:
    if (env.get(AUTH_MODE) or "").lower() == "token":
        return f"token authentication (token from {source})"
    return "no authentication"


def _set_mode(mode: str, env=os.environ) -> None:
    env[AUTH_MODE] = mode
    if env is os.environ:
        _refresh_ray_config()


def _refresh_ray_config() -> None:
    """Ray caches its config (the auth mode among it) when first used: make it read the environment again."""
    raylet = sys.modules.get("ray._raylet")
    try:
        if raylet is not None:
            raylet.Config.initialize("")
            raylet.AuthenticationTokenLoader.instance().reset_cache()
    except Exception:  # noqa: BLE001 - another Ray version: nothing cached to refresh
        pass


def _have_gcs_client() -> bool:
    try:
        # private (no type information), but the only way to ask the GCS before ray.init
        from ray._raylet import GcsClient  # type: ignore[attr-defined]  # noqa: F401
    except ImportError:
        return False
    return True


def _gcs_accepts(addr: Address, timeout: float) -> bool:
    """Whether the GCS at ``addr`` answers a request with this process's authentication (False: refused);
    ConfigError when it does not answer at all."""
    from ray._raylet import GcsClient  # type: ignore[attr-defined]

    try:
        with _quiet_stderr():  # Ray's C++ client logs its failures there: the sweep says it in one line instead
            _bounded(
                lambda: GcsClient(address=f"{addr.host}:{addr.port}").get_all_node_info(timeout=timeout),
                timeout,
                f"the Ray GCS at {addr}",
            )
        return True
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - Ray's own error types vary by version
        text = f"{type(exc).__name__}: {exc}"
        if "Auth" in type(exc).__name__ or "InvalidAuthToken" in text or "nauthenticated" in text:
            return False
        raise ConfigError(WHERE, f"the Ray cluster at {addr} did not answer ({text.splitlines()[0][:200]})") from None


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 goes to /dev/null for the duration (native code writes there, not to sys.stderr)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


# --------------------------------------------------------------------------------------------- connecting
def connect(ray, address: str | None, workers: int, runtime_env: dict, timeout: float = CONNECT_TIMEOUT_S) -> Cluster:
    """``ray.init`` on the cluster at ``address`` (checked first, everything within ``timeout`` seconds), or a
    local instance of ``workers`` CPUs when ``address`` is None."""
    if address is None:
        start_local(ray, workers, runtime_env)
        return _cluster(ray, None, "")
    t0 = time.monotonic()
    addr = parse_address(address)
    probe(addr, min(PROBE_TIMEOUT_S, timeout))
    if addr.client:
        auth = prepare_auth()
    else:
        auth = negotiate_auth(addr, max(1.0, min(PROBE_TIMEOUT_S, (timeout - (time.monotonic() - t0)) / 2)))
    left = max(5.0, timeout - (time.monotonic() - t0))
    try:
        _with_watchdog(
            lambda: ray.init(
                address=str(addr), log_to_driver=False, logging_level=logging.WARNING, runtime_env=runtime_env
            ),
            left,
            f"ray.init on {addr}",
        )
    except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError, AuthenticationError...
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        raise ConfigError(WHERE, f"cannot connect to the Ray cluster at {addr} ({text}; {DRIVER_HINT})") from None
    return _cluster(ray, str(addr), auth)


def start_local(ray, workers: int, runtime_env: dict) -> None:
    """A new local Ray instance of ``workers`` CPUs ("local": new, even where `ray start` left one running). Ray
    failing to start (its processes timing out on a loaded machine, no shared memory, ports taken...) is one
    line, exit 2, with whatever it started stopped: nothing has run and the remedy is the user's (another
    executor, a cluster, a less loaded machine), as for an unreachable --address."""
    try:
        ray.init(
            address="local",
            num_cpus=workers,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
            runtime_env=runtime_env,
        )
    except Exception as exc:  # noqa: BLE001 - TimeoutError, RuntimeError, ConnectionError, Ray's own exceptions
        with contextlib.suppress(Exception):
            ray.shutdown()
        text = f"{type(exc).__name__}: {str(exc).strip() or 'no detail'}".splitlines()[0][:200]
        raise ConfigError(
            "--executor",
            f"ray: could not start a local Ray instance ({text}); run with --executor "
            f"local, or start a cluster (ray start --head) and give --address",
        ) from None


def _cluster(ray, address: str | None, auth: str) -> Cluster:
    nodes = [n for n in ray.nodes() if n.get("Alive", n.get("alive", True))]
    cpus = int(ray.cluster_resources().get("CPU", 0))
    return Cluster(address, len(nodes), cpus, auth)


def _with_watchdog(fn, seconds: float, what: str):
    """``fn()`` in this thread (``ray.init`` sets signal handlers, which only the main thread may); if it has
    not returned after ``seconds``, the sweep ends there: one line naming ``what`` and exit status 2 (no row has
    been written yet, so there is nothing to clean up)."""

    def fire():
        print(
            f"error: {WHERE}: {what} did not finish within {seconds:.0f} s (the address answers, but Ray could "
            f"not join it: {DRIVER_HINT})",
            file=sys.stderr,
            flush=True,
        )
        os._exit(2)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        return fn()
    finally:
        timer.cancel()


def _bounded(fn, seconds: float, what: str):
    """``fn()`` in a thread, waited on for at most ``seconds``: ConfigError naming ``what`` when it takes longer
    (the thread is left behind, a daemon; the sweep then exits)."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    t = threading.Thread(target=target, name="sweep-ray-connect", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise ConfigError(WHERE, f"{what} did not answer within {seconds:.0f} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")
