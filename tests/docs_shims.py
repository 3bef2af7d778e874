"""PATH shims for the documentation's commands that cannot run on a test machine.

test_docs.py puts one executable per name below in front of PATH (`install(directory)`); each
runs `python docs_shims.py NAME ARGS...`. A shim records its call in $DOCS_CALLS, checks its
arguments against what exists (the package built from this tree, debian/, the drop-in the docs
write) and exits non-zero, saying why, when they do not match. Why each exists:

- sudo: the tests must not write the host's /etc. The page runs in a private mount namespace
  whose /etc and /var/log are overlays, so `sudo CMD` runs CMD as it is there; every path it
  names under /etc must be one the package ships or its postrm purges (so a purge leaves
  nothing behind), and `sudo maas-kubevirt` runs the CLI of the package `apt install` unpacked.
- sudoedit: an editor needs a person. It applies the next edit test_docs.py queued for that
  file (a YAML merge) and fails when none is queued or the file does not exist yet.
- apt, apt-get: installing a package on the test machine is not allowed. `apt-get build-dep ./`
  runs dpkg-checkbuilddeps on ./debian/control; `apt install ./X.deb` checks the file is this
  tree's package (name, version from debian/changelog), unpacks it into $DOCS_PKGROOT and copies
  its /etc and /var/log into the overlays, as dpkg would (keeping a file already there, as an
  upgrade keeps an edited conffile); `apt purge maas-kubevirt` stops the
  service, removes those files and runs debian/maas-kubevirt.postrm with `purge`.
- systemctl: there is no systemd as PID 1. `daemon-reload` reads the unit and its drop-ins;
  `restart maas-kubevirt` fails unless the unit is installed, its ConditionPathExists= paths and
  every LoadCredential= file exist and drop-ins changed since were reloaded, then runs the
  unit's ExecStart= in the background with $CREDENTIALS_DIRECTORY made as systemd makes it
  (after stopping the one it started before), its output the journal; it waits as systemd
  waits: for READY=1 on $NOTIFY_SOCKET (a datagram socket it holds, as systemd does for
  Type=notify, with $WATCHDOG_USEC from WatchdogSec=) within DOCS_START_TIMEOUT, else for the
  first line of output, and fails if the service exits or never says it is ready.
  `show -p NAME,... maas-kubevirt` prints those properties as the unit sets them.
- journalctl: prints that output for `-u maas-kubevirt`, the only unit there is.
- maas: MAAS's CLI needs a region host. `maas apikey --username NAME` prints every key the user
  has, one per line, as MAAS's apikey command does: here two (the one MAAS made with the account
  and the test MAAS's), so a recipe that stores that output holds two keys and the CLI refuses
  it. With `--generate` (and `--name NAME`) it prints one new key, the test MAAS's; `--delete KEY`
  of that key notes it in $DOCS_MAAS_DELETED, of any other fails as MAAS's does. With MAAS's
  source at hand (the real-MAAS tier's cache) it checks that `apikey` takes each option used.
  `maas list` prints each profile as maascli does (name, API URL, key); `maas logout PROFILE`
  forgets one.
  `maas login PROFILE URL KEY` checks the key as MAAS's CLI does (GET users/?op=whoami) and keeps
  the profile in $DOCS_MAAS_PROFILES; the region host's own API, http://localhost:5240/MAAS/, is
  the test MAAS at $DOCS_MAAS_URL. Then `maas PROFILE maas get-config name=NAME`, `maas PROFILE
  machines read [FIELD=VALUE ...]`, `maas PROFILE machine deploy SYSTEM_ID` and `maas PROFILE
  node-script delete NAME` are sent to it
  signed with the profile's key (OAuth PLAINTEXT, as maascli signs), their answer printed as MAAS's
  CLI prints it when not on a terminal (the body, as it is) and exit 2 on an HTTP error; any other
  command is refused.
- scp: the region host is this machine. `scp FILE... HOST:` copies each file into
  $DOCS_REGION_HOME (the region host's home directory) with its mode, as scp creates a new file;
  options, a remote path, a missing source or a destination without `HOST:` are refused.
- maas-kubevirt: the installed package's CLI run without sudo, as the operator's own user (the
  tests run as root, so only where the page runs it is checked, not what it may read).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("sudo", "sudoedit", "apt", "apt-get", "systemctl", "journalctl", "maas", "scp", "maas-kubevirt")
UNIT = "maas-kubevirt"


def install(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        path = directory / name
        path.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(__file__)} {name} \"$@\"\n")
        path.chmod(0o755)
    return directory


def fail(message: str) -> None:
    print(f"{os.path.basename(sys.argv[1])} (test shim): {message}", file=sys.stderr)
    sys.exit(1)


def env(name: str) -> Path:
    return Path(os.environ[name])


def record(name: str, args: list[str]) -> None:
    with open(os.environ["DOCS_CALLS"], "a") as calls:
        calls.write(json.dumps([name, *args]) + "\n")


def real_path() -> str:
    return os.environ["DOCS_REAL_PATH"]


# --- sudo --------------------------------------------------------------------------------------

def allowed_etc_paths() -> set[str]:
    """/etc paths the package ships (its unpacked tree) or its postrm removes."""
    paths = set()
    postrm = (ROOT / "debian" / "maas-kubevirt.postrm").read_text()
    paths.update(re.findall(r"/etc/[\w./-]+", postrm))
    pkgroot = env("DOCS_PKGROOT")
    if (pkgroot / "etc").is_dir():
        paths.update("/" + str(p.relative_to(pkgroot)) for p in (pkgroot / "etc").rglob("*"))
    return {p.rstrip("/.") for p in paths}


def cli(args: list[str]) -> list[str]:
    """The unpacked package's maas-kubevirt, run by the tests' Python with its own modules and data."""
    pkgroot = env("DOCS_PKGROOT")
    binary = pkgroot / "usr" / "bin" / "maas-kubevirt"
    if not binary.is_file():
        fail("maas-kubevirt is not installed: run `apt install` on the package first")
    return [sys.executable, str(binary), *args]


def cli_env() -> dict[str, str]:
    pkgroot = env("DOCS_PKGROOT")
    found = sorted((pkgroot / "usr" / "lib").glob("python3*/dist-packages"))
    return {**os.environ, "PYTHONPATH": ":".join(map(str, found)),
            "MAAS_KUBEVIRT_DATA": str(pkgroot / "usr" / "share" / "maas-kubevirt")}


def sudo(args: list[str]) -> None:
    if not args or args[0].startswith("-"):
        fail(f"the docs call sudo with a command and no option, not {args}")
    allowed = allowed_etc_paths()
    for arg in args[1:]:
        for path in re.findall(r"/etc/[\w./-]+", arg):
            if path.rstrip("/") not in allowed:
                fail(f"{path} is neither shipped by the package nor removed by its postrm: "
                     f"a purge would leave it (known: {', '.join(sorted(allowed))})")
    if args[0] == "maas-kubevirt":
        os.execve(sys.executable, cli(args[1:]), cli_env())
    os.execvp(args[0], args)


def merge(into: dict, changes: dict) -> None:
    """A YAML edit as a person makes it: nested keys set, the rest of the file kept."""
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value


def sudoedit(args: list[str]) -> None:
    if len(args) != 1:
        fail(f"expected one file, got {args}")
    path = Path(args[0])
    if not path.is_file():
        fail(f"{path} does not exist (the package ships it: install the package first)")
    queue = env("DOCS_EDITS")
    edits = json.loads(queue.read_text()) if queue.exists() else []
    if not edits:
        fail(f"no edit of {path} is queued by the test")
    edit, rest = edits[0], edits[1:]
    if edit["path"] != str(path):
        fail(f"the test queued an edit of {edit['path']}, not {path}")
    import yaml
    data = yaml.safe_load(path.read_text()) or {}
    merge(data, edit["merge"])
    path.write_text(yaml.safe_dump(data))
    queue.write_text(json.dumps(rest))


# --- apt ---------------------------------------------------------------------------------------

def apt_get(args: list[str]) -> None:
    if args != ["build-dep", "./"]:
        fail(f"only `apt-get build-dep ./` is covered, not {args}")
    if not Path("debian/control").is_file():
        fail("./debian/control does not exist: run it in the source tree")
    checked = subprocess.run(["dpkg-checkbuilddeps"], capture_output=True, text=True)
    if checked.returncode:
        fail(f"the build dependencies are not all installed: {checked.stderr.strip()}")


def apt(args: list[str]) -> None:
    if args[:1] == ["purge"]:
        purge(args[1:])
        return
    # apt takes an argument as a package file only when it is a path: ./FILE or /FILE.
    if len(args) != 2 or args[0] != "install" or not args[1].startswith(("./", "/")):
        fail(f"only `apt install ./FILE.deb` (or /PATH/FILE.deb) and `apt purge {UNIT}` are covered, not {args}")
    deb = Path(args[1])
    first = (ROOT / "debian" / "changelog").read_text().splitlines()[0]
    version = re.match(r"maas-kubevirt \(([^)]+)\)", first).group(1)
    if deb.name != f"maas-kubevirt_{version}_all.deb" or not deb.is_file():
        fail(f"{deb} is not this tree's package maas-kubevirt_{version}_all.deb (did the glob match?)")
    pkgroot = env("DOCS_PKGROOT")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(pkgroot)], check=True)
    for part in ("etc", "var/log"):
        if (pkgroot / part).is_dir():
            # An upgrade keeps a conffile the administrator edited (dpkg asks; the docs say keep it).
            shutil.copytree(pkgroot / part, "/" + part, dirs_exist_ok=True,
                            copy_function=lambda source, target: None if os.path.exists(target)
                            else shutil.copy2(source, target))
    if not (pkgroot / "lib" / "systemd" / "system" / f"{UNIT}.service").is_file():
        fail("the package has no maas-kubevirt.service")


def purge(args: list[str]) -> None:
    """As dpkg purges: the unit stopped (the package's prerm), its files and conffiles removed,
    then its postrm run with `purge`."""
    if args != [UNIT]:
        fail(f"only `apt purge {UNIT}` is covered, not {args}")
    pkgroot = env("DOCS_PKGROOT")
    if not (pkgroot / "usr" / "bin" / UNIT).is_file():
        fail(f"{UNIT} is not installed")
    data = state()
    stop_service(data)
    save(data)
    for part in ("etc", "var/log"):
        for shipped in sorted((pkgroot / part).rglob("*"), reverse=True) if (pkgroot / part).is_dir() else []:
            target = Path("/", shipped.relative_to(pkgroot))
            if target.is_file() or target.is_symlink():
                target.unlink()
            elif target.is_dir() and not any(target.iterdir()):
                target.rmdir()
    subprocess.run(["sh", "-e", str(ROOT / "debian" / f"{UNIT}.postrm"), "purge"], check=True)
    shutil.rmtree(pkgroot)


# --- systemd -----------------------------------------------------------------------------------

def unit_files() -> list[Path]:
    unit = env("DOCS_PKGROOT") / "lib" / "systemd" / "system" / f"{UNIT}.service"
    if not unit.is_file():
        fail(f"unit {UNIT}.service is not installed")
    return [unit, *sorted(Path(f"/etc/systemd/system/{UNIT}.service.d").glob("*.conf"))]


def directives(files: list[Path]) -> list[tuple[str, str]]:
    pairs = []
    for path in files:
        for line in path.read_text().splitlines():
            if line.strip() and not line.startswith(("#", ";", "[")):
                key, _, value = line.partition("=")
                pairs.append((key.strip(), value.strip()))
    return pairs


def state() -> dict:
    path = env("DOCS_JOURNAL").parent / "systemd-state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def save(data: dict) -> None:
    (env("DOCS_JOURNAL").parent / "systemd-state.json").write_text(json.dumps(data))


def fingerprint(files: list[Path]) -> list:
    return [[str(p), p.read_text()] for p in files]


def stop_service(data: dict) -> None:
    pid = data.pop("pid", None)
    if pid:
        try:
            os.killpg(pid, signal.SIGTERM)
            for _ in range(100):
                os.kill(pid, 0)
                time.sleep(0.1)
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# systemctl show's names of the directives the docs ask about (systemd.exec(5), systemd.service(5)).
SHOWN = {"Type": "Type", "NotifyAccess": "NotifyAccess", "WatchdogUSec": "WatchdogSec",
         "TimeoutStartUSec": "TimeoutStartSec", "Restart": "Restart"}


def seconds(text: str) -> float:
    """A systemd time span (systemd.time(7)): 11min, 30s, 1h 5min, 90."""
    units = {"us": 1e-6, "ms": 1e-3, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "hr": 3600}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text):
        if unit not in units and unit:
            fail(f"cannot read the time span {text!r}")
        total += float(number) * units.get(unit or "s", 1)
    return total


def show(args: list[str]) -> None:
    if len(args) != 3 or args[0] != "-p" or args[2] not in (UNIT, f"{UNIT}.service"):
        fail(f"only `systemctl show -p NAME,... {UNIT}` is covered, not {args}")
    found = dict(directives(unit_files()))
    for name in args[1].split(","):
        if name not in SHOWN:
            fail(f"systemctl show -p {name}: not a property this shim knows ({', '.join(SHOWN)})")
        print(f"{name}={found.get(SHOWN[name], '')}")


def await_ready(process: subprocess.Popen, notify, journal: Path, deadline: float) -> None:
    """Type=notify: systemctl returns once the service sends READY=1."""
    import socket

    while time.monotonic() < deadline:
        if process.poll() is not None:
            fail(f"the service exited {process.returncode} before READY=1:\n{journal.read_text()[-2000:]}")
        notify.settimeout(0.2)
        try:
            message = notify.recv(4096).decode("utf-8", "replace")
        except socket.timeout:
            continue
        if "READY=1" in message.splitlines():
            return
    fail(f"no READY=1 from the Type=notify service within the start timeout:\n{journal.read_text()[-2000:]}")


def systemctl(args: list[str]) -> None:
    data = state()
    if args == ["daemon-reload"]:
        data["loaded"] = fingerprint(unit_files())
        save(data)
        return
    if args[:1] == ["show"]:
        show(args[1:])
        return
    if len(args) != 2 or args[0] not in ("restart", "stop") or args[1] not in (UNIT, f"{UNIT}.service"):
        fail(f"only daemon-reload and restart/stop {UNIT} are covered, not {args}")
    files = unit_files()
    if "loaded" in data and data["loaded"] != fingerprint(files):
        fail("the unit or a drop-in changed since the last daemon-reload: run `systemctl daemon-reload`")
    if "loaded" not in data and len(files) > 1:
        fail("a drop-in exists that systemd has not loaded: run `systemctl daemon-reload`")
    stop_service(data)
    save(data)
    if args[0] == "stop":
        return
    pairs = directives(files)
    for key, value in pairs:
        if key == "ConditionPathExists" and not Path(value).exists():
            fail(f"ConditionPathExists={value} is not met: systemd would skip the unit")
    for key, value in pairs:   # what systemd makes for the unit before it starts
        if key == "LogsDirectory":
            for name in value.split():
                Path("/var/log", name).mkdir(parents=True, exist_ok=True)
    credentials = env("DOCS_JOURNAL").parent / "credentials"
    shutil.rmtree(credentials, ignore_errors=True)
    credentials.mkdir(mode=0o700)
    for key, value in pairs:
        if key == "LoadCredential":
            name, _, source = value.partition(":")
            if not Path(source).is_file():
                fail(f"LoadCredential={value}: {source} does not exist: the unit would fail to start")
            shutil.copyfile(source, credentials / name)
            (credentials / name).chmod(0o400)
    (command,) = [shlex.split(value) for key, value in pairs if key == "ExecStart"]
    if command[0] != "/usr/bin/maas-kubevirt":
        fail(f"ExecStart runs {command[0]}, not the package's /usr/bin/maas-kubevirt")
    journal = env("DOCS_JOURNAL")
    service_env = {**cli_env(), "CREDENTIALS_DIRECTORY": str(credentials)}
    notify = None
    if ("Type", "notify") in pairs:
        import socket

        path = env("DOCS_JOURNAL").parent / "notify.sock"
        path.unlink(missing_ok=True)
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(str(path))
        service_env["NOTIFY_SOCKET"] = str(path)
        watchdog = [value for key, value in pairs if key == "WatchdogSec"]
        if watchdog:
            service_env["WATCHDOG_USEC"] = str(int(seconds(watchdog[-1]) * 1_000_000))
    with open(journal, "a") as log:
        process = subprocess.Popen(cli(command[1:]), env=service_env,
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    data["pid"] = process.pid
    save(data)
    with open(os.environ["DOCS_PIDS"], "a") as pids:
        pids.write(f"{process.pid}\n")
    size = journal.stat().st_size
    deadline = time.monotonic() + float(os.environ.get("DOCS_START_TIMEOUT", "30"))
    if notify is not None:
        try:
            await_ready(process, notify, journal, deadline)
        finally:
            notify.close()   # the manager is gone: the service's later messages are dropped
        return
    while time.monotonic() < deadline:
        if process.poll() is not None:
            fail(f"the service exited {process.returncode}:\n{journal.read_text()[-2000:]}")
        if journal.stat().st_size > size and journal.read_text().endswith("\n"):
            time.sleep(1)
            if process.poll() is not None:
                fail(f"the service exited {process.returncode}:\n{journal.read_text()[-2000:]}")
            return
        time.sleep(0.1)
    fail(f"the service wrote nothing within {deadline} s")


def journalctl(args: list[str]) -> None:
    if args not in (["-u", UNIT], ["-u", f"{UNIT}.service"]):
        fail(f"only `journalctl -u {UNIT}` is covered, not {args}")
    unit_files()
    journal = env("DOCS_JOURNAL")
    sys.stdout.write(journal.read_text() if journal.exists() else "-- No entries --\n")


# --- MAAS's CLI --------------------------------------------------------------------------------

REGION_URL = "http://localhost:5240/MAAS/"
# What each profile command is, as MAAS's API describes it: (method, path, op).
PROFILE_COMMANDS = {("maas", "get-config"): ("GET", "maas/", "get_config"),
                    ("machines", "read"): ("GET", "machines/", None),
                    ("machine", "deploy"): ("POST", "machines/{}/", "deploy"),
                    ("node-script", "delete"): ("DELETE", "scripts/{}", None)}


def maas_request(key: str, method: str, path: str, op: str | None, fields: list[tuple[str, str]]):
    """One API request to the test MAAS, signed as maascli signs (OAuth 1.0 PLAINTEXT)."""
    import requests
    from oauthlib import oauth1

    consumer, token, secret = key.split(":")
    url = os.environ["DOCS_MAAS_URL"] + "api/2.0/" + path
    params = ([("op", op)] if op else []) + (fields if method == "GET" else [])
    signer = oauth1.Client(consumer, client_secret="", resource_owner_key=token, resource_owner_secret=secret,
                           signature_method=oauth1.SIGNATURE_PLAINTEXT)
    prepared = requests.Request(method, url, params=params, data=fields if method != "GET" else None).prepare()
    _, headers, _ = signer.sign(prepared.url, method)
    prepared.headers["Authorization"] = headers["Authorization"]
    return requests.Session().send(prepared, timeout=30)


def profiles() -> dict:
    path = Path(os.environ.get("DOCS_MAAS_PROFILES", "/nonexistent"))
    return json.loads(path.read_text()) if path.exists() else {}


def maas_login(args: list[str]) -> None:
    if len(args) != 3 or any(arg.startswith("-") for arg in args):
        fail(f"only `maas login PROFILE URL KEY` is covered, not {args}")
    name, url, key = args
    if url != REGION_URL:
        fail(f"only the region host's own API {REGION_URL} is covered, not {url}")
    if len(key.split(":")) != 3:
        fail("the API key is not of the form consumer:token:secret")
    if maas_request(key, "GET", "users/", "whoami", []).status_code != 200:
        sys.exit("The MAAS server rejected your API key.")
    saved = profiles()
    saved[name] = {"url": url, "credentials": key}
    env("DOCS_MAAS_PROFILES").write_text(json.dumps(saved))
    print(f"\nYou are now logged in to the MAAS server at {url}api/2.0/ with the profile name '{name}'.\n")


def maas_profile(args: list[str]) -> None:
    profile = profiles().get(args[0])
    if profile is None:
        fail(f"no profile {args[0]!r} (run `maas login {args[0]} URL KEY` first); besides the profile "
             "commands only `maas apikey --username NAME [--generate [--name NAME]]` is covered")
    command = tuple(args[1:3])
    if command not in PROFILE_COMMANDS:
        fail(f"only {', '.join(' '.join(c) for c in PROFILE_COMMANDS)} are covered, not {args[1:]}")
    method, path, op = PROFILE_COMMANDS[command]
    rest = args[3:]
    if "{}" in path:
        if not rest or "=" in rest[0]:
            fail(f"`maas {args[0]} {' '.join(command)}` needs a {'NAME' if command[0] == 'node-script' else 'SYSTEM_ID'}")
        path, rest = path.format(rest[0]), rest[1:]
    if not all("=" in arg for arg in rest):
        fail(f"expected FIELD=VALUE arguments, not {rest}")
    answer = maas_request(profile["credentials"], method, path, op, [tuple(arg.split("=", 1)) for arg in rest])
    sys.stdout.buffer.write(answer.content)
    sys.stdout.flush()
    if answer.status_code // 100 != 2:
        sys.exit(2)


def maas_list(args: list[str]) -> None:
    """As maascli's cmd_list: one line per profile, its name, URL and key."""
    if args:
        fail(f"only `maas list` is covered, not {args}")
    for name, profile in profiles().items():
        print(name, profile["url"] + "api/2.0/", profile["credentials"])


def maas_logout(args: list[str]) -> None:
    saved = profiles()
    if len(args) != 1 or args[0] not in saved:
        fail(f"only `maas logout PROFILE` of a profile logged in is covered, not {args}")
    del saved[args[0]]
    env("DOCS_MAAS_PROFILES").write_text(json.dumps(saved))


def maas_apikey(args: list[str]) -> None:
    options, rest = {}, list(args)
    while rest:
        option = rest.pop(0)
        if option in ("--username", "--name", "--delete") and rest:
            options[option] = rest.pop(0)
        elif option == "--generate":
            options[option] = True
        else:
            fail(f"only `maas apikey --username NAME [--generate [--name NAME] | --delete KEY]` is covered, not {args}")
    if "--username" not in options or ("--name" in options and "--generate" not in options) or \
            ("--delete" in options and len(options) != 2):
        fail(f"only `maas apikey --username NAME [--generate [--name NAME] | --delete KEY]` is covered, not {args}")
    source = os.environ.get("DOCS_MAAS_SOURCE", "")
    command = Path(source) / "src" / "maasserver" / "management" / "commands" / "apikey.py"
    if source and command.is_file():
        for option in options:
            if f'"{option}"' not in command.read_text():
                fail(f"MAAS's apikey command ({command}) takes no {option}")
    if "--delete" in options:
        # As MAAS's _delete_token: the key's middle part names the token; an unknown one is an error.
        key = options["--delete"]
        if key != os.environ["DOCS_MAAS_KEY"]:
            sys.exit("CommandError: No matching api key found.")
        with env("DOCS_MAAS_DELETED").open("a") as deleted:
            deleted.write(key + "\n")
        return
    if "--generate" not in options:
        print("Qv9bA3mZ7cXe2LpK4t:8Hs6Wd1Nf5Gj0Rk3Ty:Pm2Vb7Xc4Zq9Ln6Jh1Sd5Fg8Kw3Er0Tu")
    print(os.environ["DOCS_MAAS_KEY"])


def maas(args: list[str]) -> None:
    built_in = {"login": maas_login, "list": maas_list, "logout": maas_logout, "apikey": maas_apikey}
    if args[:1] and args[0] in built_in:
        built_in[args[0]](args[1:])
        return
    maas_profile(args)


def maas_kubevirt(args: list[str]) -> None:
    """The installed CLI, run without sudo (as the operator's own user)."""
    os.execve(sys.executable, cli(args), cli_env())


# --- scp ---------------------------------------------------------------------------------------

def scp(args: list[str]) -> None:
    if len(args) < 2 or any(arg.startswith("-") for arg in args):
        fail(f"only `scp FILE... HOST:` is covered, not {args}")
    *sources, destination = args
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*:", destination):
        fail(f"the destination must be HOST: (the region host's home directory), not {destination!r}")
    for source in sources:
        if not Path(source).is_file():
            fail(f"{source}: No such file or directory")
    home = env("DOCS_REGION_HOME")
    for source in sources:
        shutil.copy(source, home / Path(source).name)   # a new file gets the source's mode, as scp makes it


def main() -> None:
    name, args = sys.argv[1], sys.argv[2:]
    record(name, args)
    os.environ["PATH"] = os.environ.get("PATH", "")
    {"sudo": sudo, "sudoedit": sudoedit, "apt": apt, "apt-get": apt_get, "systemctl": systemctl,
     "journalctl": journalctl, "maas": maas, "scp": scp, "maas-kubevirt": maas_kubevirt}[name](args)


if __name__ == "__main__":
    main()
