"""A real Volcano cluster on one machine, as plain processes, for tests and the demo.

    scripts/volcano-cluster up [--volcano V] [--kubernetes V] | build [--volcano V] [--kubernetes V]
                            | down | status | kubeconfig | real-node | restart COMPONENT | stop COMPONENT
                            | scheduler preempting|built-in | versions

`--volcano` and `--kubernetes` (or VOLCANO_CLUSTER_VOLCANO / VOLCANO_CLUSTER_KUBERNETES) choose the
releases; the default is DEFAULT_VERSIONS (the newest the suite runs on; a newer wrapper module is
built and started only when named). `versions` lists them: one Go wrapper module
per release under cluster/gomod/ (a minor like `v1.31` picks that minor's release). `up` with other
versions than the running cluster's stops it first. `status` shows the running versions.

`stop` kills one component as a crash or a lost machine would (SIGKILL, nothing cleaned up): `stop kubelet`
leaves the real node's containers running under containerd, as in a network partition, while the node
turns NotReady. `restart` starts it again (or kills and restarts a running one).

`scheduler preempting` restarts Volcano's scheduler with a preempting action added to its built-in
configuration (cluster/scheduler/volcano-scheduler.conf: `gangpreempt` from v1.15, `preempt` before),
`scheduler built-in` without it. The first cluster starts with the built-in configuration, the
simulated-only one (below) preempting.

`real-node` prints, as JSON, the operator arguments that run a pod on the real node (node selector,
toleration, the local training image).

VOLCANO_CLUSTER_SIMULATED=1 is a second cluster beside the first: the same control plane and simulated
nodes, no real node, its own state (/tmp/airflow-volcano-cluster-simulated) and ports (the first's + 1000).
scripts/test-suite runs the tests that restart its control plane there while the real node's disruptive
tests run on the first. It needs no root, and its `down` leaves the host's pod network alone.

etcd, kube-apiserver and kube-controller-manager (k8s.io/kubernetes), Volcano's controller-manager,
scheduler and admission webhook (volcano.sh/volcano), kwok (sigs.k8s.io/kwok) for simulated nodes,
and one real node: containerd and runc (Debian), a kubelet (k8s.io/kubernetes) and CoreDNS, with
pods on a local bridge that has no route off this machine. Binaries are built once from the Go
module proxy into a cache keyed by version; images are built from Debian packages
(scripts/volcano_images.py). The control plane listens on 127.0.0.1 only; the kubelet and CoreDNS
on the bridge's address. The real node needs root (containers, network, cgroups).

Standard library only: this runs before the project's venv exists.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# A sibling module: scripts/ is on sys.path, put there by the entry point (or by Python, run directly).
import volcano_images

KWOK_VERSION = "v0.8.0"
COREDNS_VERSION = "v1.15.0"

REPO = Path(__file__).resolve().parent.parent
CLUSTER_DIR = REPO / "cluster"
# The second, simulated-only cluster (module docstring): its own state directory and ports.
SIMULATED_ONLY = os.environ.get("VOLCANO_CLUSTER_SIMULATED") == "1"
STATE = Path(os.environ.get("VOLCANO_CLUSTER_STATE")
             or ("/tmp/airflow-volcano-cluster-simulated" if SIMULATED_ONLY else "/tmp/airflow-volcano-cluster"))
CACHE_ROOT = Path(
    os.environ.get("VOLCANO_CLUSTER_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "airflow-volcano"
)
GOMOD = CLUSTER_DIR / "gomod"
IMAGE_CACHE = CACHE_ROOT / "images"
# containerd's root (image content and snapshots) outlives `down`, so a warm start imports nothing.
CONTAINERD_ROOT = CACHE_ROOT / "containerd" / "root"

HOST = "127.0.0.1"
PORT_OFFSET = 1000 if SIMULATED_ONLY else 0
PORTS = {name: port + PORT_OFFSET for name, port in {
    "etcd": 23790,
    "etcd-peer": 23800,
    "apiserver": 16443,
    "webhook": 18443,
    "kwok": 10247,
    "scheduler-metrics": 18080,
    "scheduler-healthz": 11251,
    "controller-healthz": 11252,
    "controller-metrics": 18081,
    "kubelet": 10250,
    "kubelet-healthz": 10248,
    "kube-proxy-healthz": 10256,
    "kube-proxy-metrics": 10249,
    "kube-scheduler": 10259,
}.items()}
API = f"https://{HOST}:{PORTS['apiserver']}"

# Simulated nodes: enough for the tests' gangs, and a known GPU count so "too many GPUs" is unschedulable.
NODES = [
    {"name": f"kwok-node-{i}", "cpu": "32", "memory": "128Gi", "gpu": "16", "pods": "110"}
    for i in range(2)
]
# Which kind of node a pod runs on: the real node is also tainted, so only pods that tolerate the
# taint (and select the label) run there; everything else keeps landing on the simulated nodes.
NODE_KIND_LABEL = "node.airflow-volcano.io/kind"
REAL_NODE = "real-node"
# The pod network: a bridge with this machine's side at .1 (the kubelet's node IP, CoreDNS) and no
# default route in the pods, so pod traffic can reach other pods and this bridge address only.
BRIDGE = "avbr0"
POD_SUBNET = "10.234.0.0/24"
SERVICE_SUBNET = "10.96.0.0/16"
BRIDGE_IP = "10.234.0.1"
# The bridge's own MAC address, set once: a Linux bridge whose address was not set takes the lowest
# address of its ports and changes it as pods come and go, while every pod's ARP cache keeps the old
# one; until that entry expires (10 to 35 s, seen under test load) a pod's packets to this machine,
# its DNS queries among them, are lost ("Temporary failure in name resolution", DeepSpeed's "not
# reachable via ssh"). Locally administered (02:), ending in the bridge address's bytes.
BRIDGE_MAC = "02:00:0a:ea:00:01"
CLUSTER_DOMAIN = "cluster.local"
# The admission webhooks of Volcano's resources this cluster registers; each release enables those of
# its Helm chart's defaults (enabled_admissions), e.g. v1.10 mutates PodGroups, v1.14 validates them.
# (Pod webhooks, which v1.10's chart also enables, are left out: they would sit in front of every pod.)
WEBHOOKS = {
    "/jobs/mutate": ("mutating", "batch.volcano.sh", "v1alpha1", "jobs", ["CREATE"]),
    "/jobs/validate": ("validating", "batch.volcano.sh", "v1alpha1", "jobs", ["CREATE", "UPDATE"]),
    "/podgroups/mutate": ("mutating", "scheduling.volcano.sh", "v1beta1", "podgroups", ["CREATE"]),
    "/podgroups/validate": ("validating", "scheduling.volcano.sh", "v1beta1", "podgroups", ["CREATE"]),
    "/queues/mutate": ("mutating", "scheduling.volcano.sh", "v1beta1", "queues", ["CREATE"]),
    "/queues/validate": (
        "validating", "scheduling.volcano.sh", "v1beta1", "queues", ["CREATE", "UPDATE", "DELETE"],
    ),
}


def enabled_webhooks() -> dict[str, tuple]:
    """WEBHOOKS as the chosen Volcano release's Helm chart enables them by default."""
    chart_dir = module_dir("volcano.sh/volcano", VERSIONS.volcano) / "installer" / "helm" / "chart" / "volcano"
    values = chart_dir / "values.yaml"
    match = re.search(r"enabled_admissions:\s*\"([^\"]*)\"", values.read_text())
    if match is None:
        raise ClusterError(f"no enabled_admissions in {values}")
    chart = set(match.group(1).split(","))
    return {path: webhook for path, webhook in WEBHOOKS.items() if path in chart}


def log(message: str) -> None:
    print(f"[volcano-cluster {time.strftime('%H:%M:%S')}] {message}", flush=True)


class ClusterError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------
# Versions: each release has its Go wrapper module (cluster/gomod/<project>-<version>) and its own
# cache directory of binaries, so every combination reuses what an earlier one built.
# ---------------------------------------------------------------------------------------------

VERSION_ENV = {"volcano": "VOLCANO_CLUSTER_VOLCANO", "kubernetes": "VOLCANO_CLUSTER_KUBERNETES"}
# The releases `up` and `build` choose when none is named, so `make test`'s newest corner: the newest
# the whole suite has passed on. A wrapper module of a newer release is built and started only when
# named, until it is moved here.
DEFAULT_VERSIONS = {"volcano": "v1.15.1", "kubernetes": "v1.35.8"}


def release_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.lstrip("v").split("."))


def known_versions(project: str) -> list[str]:
    """The releases of `project` (volcano, kubernetes) this script can build, oldest first."""
    found = [path.name.removeprefix(f"{project}-") for path in GOMOD.glob(f"{project}-v*") if path.is_dir()]
    return sorted(found, key=release_key)


def resolve_version(project: str, wanted: str | None) -> str:
    """A release of `project`: `wanted` exactly, the newest of a minor (v1.31 or v1.31.x), or the default."""
    versions = known_versions(project)
    if not wanted:
        wanted = DEFAULT_VERSIONS[project]
    spec = wanted if wanted.startswith("v") else f"v{wanted}"
    spec = spec.removesuffix(".x")
    matching = [version for version in versions if version == spec or version.startswith(spec + ".")]
    if not matching:
        raise ClusterError(f"--{project} {wanted}: no wrapper module for it under {GOMOD} (known: "
                           f"{', '.join(versions)}); add cluster/gomod/{project}-<version> to build another release")
    return matching[-1]


@dataclass(frozen=True)
class Versions:
    kubernetes: str
    volcano: str

    def bin_dir(self, project: str) -> Path:
        version = {"kubernetes": self.kubernetes, "volcano": self.volcano, "kwok": KWOK_VERSION,
                   "coredns": COREDNS_VERSION}[project]
        return CACHE_ROOT / "bin" / f"{project}-{version}"

    def describe(self) -> str:
        return f"Kubernetes {self.kubernetes}, Volcano {self.volcano}"


def chosen_versions(volcano: str | None = None, kubernetes: str | None = None) -> Versions:
    return Versions(kubernetes=resolve_version("kubernetes", kubernetes or os.environ.get(VERSION_ENV["kubernetes"])),
                    volcano=resolve_version("volcano", volcano or os.environ.get(VERSION_ENV["volcano"])))


# What `up` (or `build`) chose; the running cluster's versions are in STATE/versions.json.
VERSIONS = chosen_versions() if GOMOD.exists() else Versions("", "")


def running_versions() -> Versions | None:
    path = STATE / "versions.json"
    try:
        return Versions(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def binary(name: str) -> Path:
    """Where the cached binary of a component of the chosen versions is."""
    return VERSIONS.bin_dir(PROJECT_OF[name]) / name


# ---------------------------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------------------------

def kube_ldflags(version: str) -> str:
    return " ".join([
        "-s -w",
        f"-X k8s.io/component-base/version.gitVersion={version}",
        f"-X k8s.io/component-base/version.gitMajor={version[1:].split('.')[0]}",
        f"-X k8s.io/component-base/version.gitMinor={version.split('.')[1]}",
        "-X k8s.io/component-base/version.gitTreeState=clean",
    ])


BINARIES = {
    # name: (project, package, whether it takes Kubernetes' version ldflags); the project's wrapper
    # module (cluster/gomod/<project>-<version>) pins every module version
    "etcd": ("kubernetes", "go.etcd.io/etcd/server/v3", False),
    "kube-apiserver": ("kubernetes", "k8s.io/kubernetes/cmd/kube-apiserver", True),
    "kube-controller-manager": ("kubernetes", "k8s.io/kubernetes/cmd/kube-controller-manager", True),
    "kubelet": ("kubernetes", "k8s.io/kubernetes/cmd/kubelet", True),
    "kube-proxy": ("kubernetes", "k8s.io/kubernetes/cmd/kube-proxy", True),
    "kube-scheduler": ("kubernetes", "k8s.io/kubernetes/cmd/kube-scheduler", True),
    "vc-controller-manager": ("volcano", "volcano.sh/volcano/cmd/controller-manager", False),
    "vc-scheduler": ("volcano", "volcano.sh/volcano/cmd/scheduler", False),
    "vc-webhook-manager": ("volcano", "volcano.sh/volcano/cmd/webhook-manager", False),
}
# Built with `go install MODULE@VERSION` (no replace lines to repeat).
INSTALLED = {
    "kwok": f"sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}",
    "coredns": f"github.com/coredns/coredns@{COREDNS_VERSION}",
}
PROJECT_OF = {**{name: project for name, (project, _, _) in BINARIES.items()}, "kwok": "kwok", "coredns": "coredns"}


# libfaketime, preloaded directly: the `faketime` wrapper keeps a POSIX semaphore named after its own pid
# in /dev/shm and removes it only when it exits normally, so a wrapper killed once leaves it behind, and a
# later wrapper given the same pid fails ("sem_open: File exists"). A fixed offset needs none of that state.
LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def faketime_env(offset: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) for a process whose wall clock, and its children's, runs `offset`
    off the machine's (libfaketime's format: "-1d", "+20m")."""
    env = dict(os.environ if env is None else env)
    preload = " ".join(part for part in (LIBFAKETIME, env.get("LD_PRELOAD", "")) if part)
    return {**env, "LD_PRELOAD": preload, "FAKETIME": offset}


# What the host needs, as (the file that shows it is there, the Debian package that brings it).
HOST_TOOLS = [
    ("openssl", "openssl"), ("kubectl", "kubectl"), ("ip", "iproute2"), ("tar", "tar"),
    ("containerd", "containerd"), ("ctr", "containerd"), ("runc", "runc"),
    ("/usr/lib/cni/bridge", "containernetworking-plugins"), ("debootstrap", "debootstrap"),
    ("gcc", "gcc"), ("/usr/lib/x86_64-linux-gnu/libc.a", "libc6-dev"),
    # The clock-skew tests run a worker or a triggerer with its clock 20 minutes off (libfaketime).
    (LIBFAKETIME, "libfaketime"),
]


def present(tool: str) -> bool:
    return Path(tool).exists() if tool.startswith("/") else shutil.which(tool) is not None


def ensure_tools() -> None:
    wanted = sorted({package for tool, package in HOST_TOOLS if not present(tool)})
    if not wanted:
        return
    log(f"installing Debian packages: {' '.join(wanted)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *wanted], check=True, env=env)


def patched_modfile(wrapper: Path, work: Path) -> Path | None:
    """For a wrapper module with an overlay.json, a go.mod for `go build -modfile` whose listed modules
    are copies with files added; None for a wrapper without one (the usual case).

    overlay.json names, per module of the build, files to lay over that module's source, each
    backed by a file in the wrapper directory: {"MODULE": {"PATH/IN/MODULE.go": "FILE"}}. A release
    uses it where the Go module proxy lacks what the release was built with (Volcano v1.15.1: a
    constant of volcano.sh/apis 1.15, whose versions the proxy refuses). `go build -overlay` may not
    touch the module cache, so the module is copied (from the version the wrapper pins, as the proxy
    served it) into `work`, outside the repository, the files laid over it, and the copy replaces
    the module in a go.mod beside it (the wrapper's own, with that one replace line changed)."""
    manifest = wrapper / "overlay.json"
    if not manifest.exists():
        return None
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    modfile = work / "go.mod"
    shutil.copyfile(wrapper / "go.mod", modfile)
    shutil.copyfile(wrapper / "go.sum", work / "go.sum")
    for module, files in json.loads(manifest.read_text()).items():
        # In the wrapper, so its replace lines apply: the source of the version it builds with.
        result = subprocess.run(["go", "mod", "download", "-json", module], cwd=wrapper, capture_output=True,
                                text=True, env=dict(os.environ, GOFLAGS="-mod=mod"))
        source = json.loads(result.stdout or "{}").get("Dir") if result.returncode == 0 else None
        if not source:
            raise ClusterError(f"{manifest}: no source of {module}: {result.stdout}{result.stderr}".strip())
        copy = work / module.replace("/", "_")
        shutil.copytree(source, copy, copy_function=shutil.copyfile)  # the module cache's files are read-only
        for directory in (copy, *(path for path in copy.rglob("*") if path.is_dir())):
            directory.chmod(0o755)
        for path, backing in files.items():
            shutil.copyfile(wrapper / backing, copy / path)
        subprocess.run(["go", "mod", "edit", f"-replace={module}={copy}", str(modfile)], check=True,
                       env=dict(os.environ, GOFLAGS=""))
    return modfile


def build() -> None:
    ensure_tools()
    if shutil.which("go") is None:
        raise ClusterError("Go is required to build the cluster binaries (not found on PATH)")
    env = dict(os.environ, GOFLAGS="-mod=mod")
    todo = [name for name in [*BINARIES, *INSTALLED] if not binary(name).exists()]
    if todo:
        log(f"building {', '.join(todo)} for {VERSIONS.describe()} (first time only: several minutes)")
    for name in todo:
        target = binary(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        build_log = target.parent / f"{name}.build.log"
        started = time.monotonic()
        log(f"  go build {name} into {target.parent} ...")
        if name in INSTALLED:
            cmd = ["go", "install", "-ldflags", "-s -w", INSTALLED[name]]
            run_env = dict(env, GOBIN=str(target.parent), GOFLAGS="")
            cwd = target.parent
        else:
            project, package, versioned = BINARIES[name]
            version = getattr(VERSIONS, project)
            ldflags = kube_ldflags(version) if versioned else "-s -w"
            cwd = GOMOD / f"{project}-{version}"
            modfile = patched_modfile(cwd, CACHE_ROOT / "src" / f"{project}-{version}")
            cmd = ["go", "build", "-ldflags", ldflags, *([f"-modfile={modfile}"] if modfile else []),
                   "-o", f"{target}.tmp", package]
            run_env = env
        with build_log.open("w") as out:
            result = subprocess.run(cmd, cwd=cwd, env=run_env, stdout=out, stderr=subprocess.STDOUT)
        if result.returncode != 0:
            tail = build_log.read_text().splitlines()[-15:]
            raise ClusterError(f"building {name} failed; log: {build_log}\n" + "\n".join(tail))
        if name not in INSTALLED:
            Path(f"{target}.tmp").rename(target)
        log(f"  {name} built in {time.monotonic() - started:.0f}s")
    volcano_images.ensure_archives(IMAGE_CACHE, log)


# ---------------------------------------------------------------------------------------------
# Certificates and kubeconfig
# ---------------------------------------------------------------------------------------------


def openssl(*args: str) -> None:
    """openssl with its clock a day behind: the certificates it makes are valid from a day ago, so a
    client whose clock runs behind the cluster's (the clock-skew tests) trusts them from the start."""
    subprocess.run(["openssl", *args], env=faketime_env("-1d"), check=True, capture_output=True)


def make_pki(pki: Path) -> None:
    pki.mkdir(parents=True, exist_ok=True)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
            "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt"),
            "-subj", "/CN=airflow-volcano-local-ca",
            # What a strict verifier (Python 3.13's default context, in the training image) requires of a CA.
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
    openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    leaves = {
        "apiserver": ("/CN=kube-apiserver", "serverAuth",
                      "IP:127.0.0.1,DNS:localhost,IP:10.96.0.1,DNS:kubernetes.default.svc"),
        "webhook": ("/CN=volcano-admission", "serverAuth", "IP:127.0.0.1,DNS:localhost"),
        "kwok": ("/CN=kwok", "serverAuth", "IP:127.0.0.1,DNS:localhost"),
        "admin": ("/O=system:masters/CN=admin", "clientAuth", ""),
    }
    for name, (subject, usage, san) in leaves.items():
        ext = pki / f"{name}.ext"
        lines = [f"extendedKeyUsage={usage}", "keyUsage=digitalSignature,keyEncipherment",
                 "authorityKeyIdentifier=keyid,issuer", "subjectKeyIdentifier=hash"]
        if san:
            lines.append(f"subjectAltName={san}")
        ext.write_text("\n".join(lines) + "\n")
        openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(pki / f"{name}.key"),
                "-out", str(pki / f"{name}.csr"), "-subj", subject)
        openssl("x509", "-req", "-in", str(pki / f"{name}.csr"), "-CA", str(pki / "ca.crt"),
                "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", "3650",
                "-extfile", str(ext), "-out", str(pki / f"{name}.crt"))


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(pki: Path, path: Path) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "volcano-local", "cluster": {
            "server": API, "certificate-authority-data": b64(pki / "ca.crt")}}],
        "users": [{"name": "admin", "user": {
            "client-certificate-data": b64(pki / "admin.crt"),
            "client-key-data": b64(pki / "admin.key")}}],
        "contexts": [{"name": "volcano-local", "context": {"cluster": "volcano-local", "user": "admin"}}],
        "current-context": "volcano-local",
    }
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------


def pid_file(name: str) -> Path:
    return STATE / "pids" / f"{name}.pid"


def running_pid(name: str) -> int | None:
    """The pid of a component this script started, if it is still that process."""
    path = pid_file(name)
    if not path.exists():
        return None
    pid, _, binary = path.read_text().partition(" ")
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return None
    return int(pid) if cmdline == binary.strip() else None


def start(name: str, argv: list[str]) -> None:
    logs = STATE / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (STATE / "pids").mkdir(parents=True, exist_ok=True)
    out = (logs / f"{name}.log").open("ab")
    process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True, cwd=STATE)
    pid_file(name).write_text(f"{process.pid} {argv[0]}")
    (STATE / "pids" / f"{name}.argv").write_text(json.dumps(argv))
    # Until the child has exec'd, /proc shows Python's command line; wait so checks see the binary.
    deadline = time.monotonic() + 5
    while running_pid(name) is None and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)


def fail_with_log(name: str, what: str) -> ClusterError:
    log_path = STATE / "logs" / f"{name}.log"
    tail = log_path.read_text(errors="replace").splitlines()[-20:] if log_path.exists() else []
    return ClusterError(f"{what}; log: {log_path}\n" + "\n".join(tail))


def wait_for(name: str, what: str, check: Callable[[], bool], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if name and running_pid(name) is None:
            raise fail_with_log(name, f"{name} exited while waiting for {what}")
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - not ready yet, whatever the reason
            pass
        time.sleep(0.25)
    raise fail_with_log(name, f"timed out after {timeout:.0f}s waiting for {what}")


def api_get(path: str) -> bytes:
    pki = STATE / "pki"
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    with urllib.request.urlopen(API + path, context=context, timeout=5) as response:
        return response.read()


def kubectl(*args: str, stdin: str | None = None) -> str:
    result = subprocess.run(["kubectl", f"--kubeconfig={STATE / 'kubeconfig'}", *args],
                            input=stdin, capture_output=True, text=True)
    if result.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


@functools.cache  # asked for the same release's sources by several steps of `up`
def module_dir(module: str, version: str) -> Path:
    # Run outside any module so the download cannot touch a wrapper's go.mod.
    result = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], cwd=CACHE_ROOT,
                            capture_output=True, text=True, env=dict(os.environ, GOFLAGS=""))
    if result.returncode != 0:
        raise ClusterError(f"go mod download {module}@{version} failed: {result.stderr.strip()}")
    return Path(json.loads(result.stdout)["Dir"])


# ---------------------------------------------------------------------------------------------
# Components: one table drives up, down, status and restart
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Component:
    """One process of the cluster. `up` runs prepare, starts argv, waits for ready, then runs setup;
    `restart` kills and starts it again with the same argv and waits for ready; `down` runs
    before_stop, then stops it (in reverse table order)."""

    name: str
    argv: Callable[[], list[str]]
    ready: tuple[str, Callable[[], bool]] | None = None
    ready_timeout: float = 90
    prepare: Callable[[], None] | None = None
    setup: Callable[[], None] | None = None
    before_stop: Callable[[], None] | None = None
    port: int | None = None  # a listener that must be gone before a restarted process binds it
    real_node: bool = False  # part of the real node (needs root)


def admin_kubeconfig() -> str:
    return str(STATE / "kubeconfig")


def pki_path(name: str) -> str:
    return str(STATE / "pki" / name)


# --- control plane -------------------------------------------------------------------------------

def etcd_argv() -> list[str]:
    peer, client = f"http://{HOST}:{PORTS['etcd-peer']}", f"http://{HOST}:{PORTS['etcd']}"
    return [str(binary("etcd")), "--name=local", f"--data-dir={STATE / 'etcd'}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=local={peer}", "--log-level=warn"]


def apiserver_argv() -> list[str]:
    return [
        str(binary("kube-apiserver")),
        f"--etcd-servers=http://{HOST}:{PORTS['etcd']}",
        *apiserver_addresses(), f"--secure-port={PORTS['apiserver']}",
        f"--tls-cert-file={pki_path('apiserver.crt')}", f"--tls-private-key-file={pki_path('apiserver.key')}",
        f"--client-ca-file={pki_path('ca.crt')}",
        f"--service-account-key-file={pki_path('sa.pub')}",
        f"--service-account-signing-key-file={pki_path('sa.key')}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        # A pod's token lives as long as its projected volume says (Airflow's pods here: 600 s, rotated by
        # the kubelet), not a year as by default for the kubelet's usual 3607 s ones.
        "--service-account-extend-token-expiration=false",
        f"--service-cluster-ip-range={SERVICE_SUBNET}",
        "--authorization-mode=RBAC",
        # The apiserver reaches the real node's kubelet (logs, exec) with the admin client certificate.
        f"--kubelet-client-certificate={pki_path('admin.crt')}", f"--kubelet-client-key={pki_path('admin.key')}",
        "--kubelet-preferred-address-types=InternalIP",
        # No node lifecycle controller runs here to lift the not-ready taint this plugin puts on new nodes.
        "--disable-admission-plugins=TaintNodesByCondition",
        "--profiling=false",
    ]


def apiserver_addresses() -> list[str]:
    """Where the apiserver listens, and what it publishes as the `kubernetes` Service's endpoint.

    With a real node, pods reach it as a pod in any cluster does: through that Service's ClusterIP
    (10.96.0.1, the in-cluster configuration the kubelet puts in every pod's environment), which
    kube-proxy turns into this machine's address on the pod bridge; so it listens on every address
    and publishes the bridge's. The simulated-only cluster has no pods that run: loopback only, no
    endpoint (a loopback endpoint is refused)."""
    if SIMULATED_ONLY:
        return [f"--bind-address={HOST}", f"--advertise-address={HOST}", "--endpoint-reconciler-type=none"]
    return ["--bind-address=0.0.0.0", f"--advertise-address={BRIDGE_IP}"]


def install_crds_and_webhooks() -> None:
    volcano = module_dir("volcano.sh/volcano", VERSIONS.volcano)
    kwok = module_dir("sigs.k8s.io/kwok", KWOK_VERSION)
    crds = sorted((volcano / "config" / "crd").rglob("*.yaml"))
    # Every CRD Volcano ships, minus the legacy apiextensions/v1beta1 copies (for Kubernetes < 1.16).
    crds = [path for path in crds if "kustomization" not in path.name and path.parent.name != "v1beta1"]
    crds += [kwok / "kustomize" / "crd" / "bases" / f"kwok.x-k8s.io_{kind}.yaml" for kind in ("logs", "clusterlogs")]
    for crd in crds:
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    apply_webhook_configurations(STATE / "pki")


def controller_manager_argv() -> list[str]:
    return [
        str(binary("kube-controller-manager")), f"--kubeconfig={admin_kubeconfig()}", "--leader-elect=false",
        # Only what this cluster needs: the default ServiceAccount and the CA ConfigMap pods mount,
        # owner-reference garbage collection, namespace deletion, the EndpointSlices that give
        # the real node's pods their DNS names (<job>-master-0.<job>), and node lifecycle as in any
        # cluster: a node whose kubelet stops renewing its Lease turns NotReady after the grace period,
        # is tainted, and its pods are marked not Ready (lost-node tests). The grace period is 20 s here
        # (Kubernetes' default: 50 s; the kubelet renews its Lease every 10 s): the lost-node tests wait
        # for it, and the provider's behaviour does not depend on its length.
        "--controllers=serviceaccount,serviceaccount-token,root-ca-cert-publisher,garbagecollector,namespace,"
        "endpoint,endpointslice,nodelifecycle,taint-eviction-controller,"
        # and the workload controllers Airflow's own Deployments and migration Job need when Airflow runs in
        # the cluster (scripts/airflow-in-cluster).
        "deployment,replicaset,job", "--node-monitor-grace-period=20s",
        f"--service-account-private-key-file={pki_path('sa.key')}", f"--root-ca-file={pki_path('ca.crt')}",
        "--use-service-account-credentials=false", "--secure-port=0",
    ]


def default_service_account_exists() -> bool:
    return kubectl("get", "serviceaccount", "default", "-n", "default", "-o", "name").strip() != ""


def webhook_argv() -> list[str]:
    return [
        str(binary("vc-webhook-manager")), f"--kubeconfig={admin_kubeconfig()}",
        f"--listen-address={HOST}", f"--port={PORTS['webhook']}",
        f"--tls-cert-file={pki_path('webhook.crt')}", f"--tls-private-key-file={pki_path('webhook.key')}",
        f"--ca-cert-file={pki_path('ca.crt')}", f"--webhook-url=https://{HOST}:{PORTS['webhook']}",
        f"--enabled-admission={','.join(enabled_webhooks())}",
    ]


def kwok_argv() -> list[str]:
    return [
        str(binary("kwok")), f"--kubeconfig={admin_kubeconfig()}", f"--config={CLUSTER_DIR / 'kwok' / 'stages.yaml'}",
        "--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        f"--server-address={HOST}:{PORTS['kwok']}", f"--node-ip={HOST}", f"--node-port={PORTS['kwok']}",
        f"--tls-cert-file={pki_path('kwok.crt')}", f"--tls-private-key-file={pki_path('kwok.key')}",
        # Simulated pod IPs: never used to send anything, but not loopback (EndpointSlices refuse those).
        "--enable-crds=Logs,ClusterLogs", "--cidr=10.235.0.1/16",
        # Simulated nodes renew Leases as a kubelet does, so the node lifecycle controller keeps them Ready.
        "--node-lease-duration-seconds=40",
    ]


_HELP: dict[str, str] = {}


def has_flag(name: str, flag: str) -> bool:
    """Whether a component's binary takes `flag` (releases differ: Volcano v1.10's controller manager
    has no metrics listener, for example). Read from its --help, once."""
    if name not in _HELP:
        result = subprocess.run([str(binary(name)), "--help"], capture_output=True, text=True, timeout=60)
        _HELP[name] = result.stdout + result.stderr
    return re.search(rf"(^|\s){re.escape(flag)}[\s=]", _HELP[name], re.MULTILINE) is not None


def vc_controller_argv() -> list[str]:
    metrics = f"--listen-address={HOST}:{PORTS['controller-metrics']}"
    return [
        str(binary("vc-controller-manager")), f"--kubeconfig={admin_kubeconfig()}", "--leader-elect=false",
        f"--healthz-address={HOST}:{PORTS['controller-healthz']}",
        *([metrics] if has_flag("vc-controller-manager", "--listen-address") else []),
        # Its default client limit (50 requests/s) makes it the bottleneck once thousands of Jobs
        # start at once (benchmarks/triggerer_capacity.py: ~50 Jobs Running per minute at 10,000).
        "--kube-api-qps=500", "--kube-api-burst=1000",
    ]


SCHEDULER_CONF = Path(__file__).resolve().parent.parent / "cluster" / "scheduler" / "volcano-scheduler.conf"


def preempt_action(volcano: str) -> str:
    """The preempting action of a Volcano release: gang-aware from v1.15 on."""
    major, minor = (int(part) for part in volcano.lstrip("v").split(".")[:2])
    return "gangpreempt" if (major, minor) >= (1, 15) else "preempt"


def scheduler_configuration(preempting: bool, volcano: str) -> str:
    """cluster/scheduler/volcano-scheduler.conf: with the release's preempting action, or without it (then
    it is Volcano's built-in configuration)."""
    template = SCHEDULER_CONF.read_text()
    return template.replace("PREEMPT_ACTION", preempt_action(volcano)) if preempting \
        else template.replace("PREEMPT_ACTION, ", "")


def scheduler_conf(preempting: bool = SIMULATED_ONLY) -> Path:
    """The scheduler's configuration file, in the state directory (the scheduler reads it when it starts)."""
    path = STATE / "volcano-scheduler.conf"
    # Whole at once (a rename): a running scheduler rereads the file as it is written.
    written = path.with_suffix(".new")
    written.write_text(scheduler_configuration(preempting, (running_versions() or VERSIONS).volcano))
    os.replace(written, path)
    return path


def set_scheduler(mode: str) -> None:
    """`scheduler preempting|built-in`: the running scheduler restarted with or without the preempting action."""
    if mode not in ("preempting", "built-in"):
        raise ClusterError(f"unknown scheduler configuration {mode!r} (preempting, built-in)")
    scheduler_conf(preempting=mode == "preempting")
    restart("vc-scheduler")
    log(f"the scheduler runs the {mode} configuration")


def vc_scheduler_argv() -> list[str]:
    # The simulated-only cluster's scheduler preempts (the built-in configuration with a preempting action):
    # its preemption tests run there one at a time. The first cluster's runs the built-in configuration:
    # with a preempting action there, two CI runs each saw one test's gangs wait minutes for their pods,
    # beside the other tests (why is not understood: docs/local-cluster.md); its one preemption test
    # (tests/integration/test_preemption.py, a training on the real node) turns preemption on for itself
    # with `scheduler preempting` and runs alone (marked disruptive).
    return [
        str(binary("vc-scheduler")), f"--kubeconfig={admin_kubeconfig()}", "--leader-elect=false",
        f"--listen-address={HOST}:{PORTS['scheduler-metrics']}",
        f"--healthz-address={HOST}:{PORTS['scheduler-healthz']}",
        "--schedule-period=200ms", f"--scheduler-conf={scheduler_conf()}",
        # Its sessions' and actions' latencies on the metrics port (off by default).
        "--enable-metrics",
    ]


def default_queue_open() -> bool:
    return kubectl("get", "queue", "default", "-o", "jsonpath={.status.state}") == "Open"


# --- the real node: containerd, CoreDNS, kubelet ------------------------------------------------

def containerd_dir() -> Path:
    return STATE / "containerd"


def containerd_socket() -> str:
    return str(containerd_dir() / "containerd.sock")


def ctr(*args: str, check: bool = True) -> str:
    result = subprocess.run(["ctr", f"--address={containerd_socket()}", "--namespace=k8s.io", *args],
                            capture_output=True, text=True)
    if check and result.returncode != 0:
        raise ClusterError(f"ctr {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def bridge_mac_is_fixed() -> bool:
    """The bridge has BRIDGE_MAC, set by hand (addr_assign_type 3, NET_ADDR_SET), which the kernel
    keeps whatever ports come and go."""
    device = Path("/sys/class/net") / BRIDGE
    try:
        return ((device / "address").read_text().strip() == BRIDGE_MAC
                and (device / "addr_assign_type").read_text().strip() == "3")
    except OSError:
        return False


def prepare_network() -> None:
    """The pod bridge, with this machine's address on it, and the CNI configuration that uses it.

    The bridge plugin runs with isGateway off, so it neither takes the address nor turns on IP
    forwarding, and pods get a route to the pod subnet only: nothing leaves the machine."""
    if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode != 0:
        subprocess.run(["ip", "link", "add", BRIDGE, "address", BRIDGE_MAC, "type", "bridge"], check=True)
    if not bridge_mac_is_fixed():
        subprocess.run(["ip", "link", "set", BRIDGE, "address", BRIDGE_MAC], check=True)
    addresses = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", BRIDGE], capture_output=True,
                               text=True, check=True).stdout
    if f" {BRIDGE_IP}/" not in addresses:
        prefix = POD_SUBNET.split("/")[1]
        subprocess.run(["ip", "addr", "add", f"{BRIDGE_IP}/{prefix}", "dev", BRIDGE], check=True)
    subprocess.run(["ip", "link", "set", BRIDGE, "up"], check=True)
    # A Service's ClusterIP that kube-proxy translates to a pod's address is routed back out of the
    # bridge: forwarding on for the bridge alone (the machine's other interfaces keep theirs).
    Path(f"/proc/sys/net/ipv4/conf/{BRIDGE}/forwarding").write_text("1\n")
    network = STATE / "cni" / "net.d"
    network.mkdir(parents=True, exist_ok=True)
    base = POD_SUBNET.rsplit(".", 1)[0]
    (network / "10-airflow-volcano.conflist").write_text(json.dumps({
        "cniVersion": "1.0.0",
        "name": "airflow-volcano",
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": False, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "dataDir": str(STATE / "cni" / "ipam"),
                      "ranges": [[{"subnet": POD_SUBNET, "rangeStart": f"{base}.10", "gateway": BRIDGE_IP}]],
                      # Services' ClusterIPs through this machine (kube-proxy), and nothing else.
                      "routes": [{"dst": SERVICE_SUBNET, "gw": BRIDGE_IP}]}},
            {"type": "loopback"},
        ],
    }, indent=2))


def containerd_argv() -> list[str]:
    directory = containerd_dir()
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "config.toml"
    CONTAINERD_ROOT.mkdir(parents=True, exist_ok=True)
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    config.write_text("\n".join([
        "version = 2",
        f'root = "{CONTAINERD_ROOT}"',
        f'state = "{directory / "state"}"',
        "[grpc]",
        f'  address = "{containerd_socket()}"',
        "[ttrpc]",
        f'  address = "{directory / "containerd.sock.ttrpc"}"',
        '[plugins."io.containerd.internal.v1.opt"]',
        f'  path = "{directory / "opt"}"',
        f"[{cri}]",
        f'  sandbox_image = "{volcano_images.PAUSE_REFERENCE}"',
        # This machine lacks CAP_SYS_RESOURCE: without this every sandbox fails in runc
        # ("failed to update /proc/self/oom_score_adj: Permission denied").
        "  restrict_oom_score_adj = true",
        f"[{cri}.containerd]",
        '  snapshotter = "overlayfs"',
        '  default_runtime_name = "runc"',
        f"[{cri}.containerd.runtimes.runc]",
        '  runtime_type = "io.containerd.runc.v2"',
        f"[{cri}.containerd.runtimes.runc.options]",
        "  SystemdCgroup = false",
        f"[{cri}.cni]",
        '  bin_dir = "/usr/lib/cni"',
        f'  conf_dir = "{STATE / "cni" / "net.d"}"',
        "",
    ]))
    return ["containerd", f"--config={config}"]


def containerd_serving() -> bool:
    return subprocess.run(["ctr", f"--address={containerd_socket()}", "version"], capture_output=True).returncode == 0


def remove_containers() -> None:
    """Kill and delete every container containerd holds for Kubernetes (pods of an earlier run)."""
    containers = ctr("containers", "list", "--quiet", check=False).split()
    if containers:
        ctr("tasks", "delete", "--force", *containers, check=False)  # kills what still runs
        ctr("containers", "delete", *containers, check=False)


def import_images(images: list[volcano_images.Image] | None = None) -> None:
    """Import each image (default: the cluster's own) whose archive is not what containerd already holds
    under that name."""
    archives = volcano_images.ensure_archives(IMAGE_CACHE, log, images or volcano_images.IMAGES)
    marker_file = CONTAINERD_ROOT.parent / "imported.json"
    imported = json.loads(marker_file.read_text()) if marker_file.exists() else {}
    present_refs = set(ctr("images", "list", "--quiet").split())
    for image, archive in archives.items():
        if image.reference in present_refs and imported.get(image.reference) == archive.name:
            continue
        started = time.monotonic()
        log(f"importing {image.reference} into containerd ({archive.stat().st_size / 2**20:.0f} MiB) ...")
        ctr("images", "import", "--snapshotter=overlayfs", str(archive))
        imported[image.reference] = archive.name
        marker_file.write_text(json.dumps(imported, indent=2))
        log(f"imported {image.reference} in {time.monotonic() - started:.0f}s")


def containerd_setup() -> None:
    leftovers = ctr("containers", "list", "--quiet", check=False).split()
    if leftovers:
        # Pods of a run that ended without `down`: remove them, then restart containerd so its
        # CRI plugin forgets them too, before a kubelet asks.
        log(f"removing {len(leftovers)} containers left by an earlier run")
        remove_containers()
        restart("containerd")
    import_images()


def coredns_argv() -> list[str]:
    corefile = STATE / "coredns" / "Corefile"
    corefile.parent.mkdir(parents=True, exist_ok=True)
    # Cluster names only, answered from the apiserver; nothing is forwarded off the machine.
    corefile.write_text(
        f".:53 {{\n    bind {BRIDGE_IP}\n    errors\n"
        f"    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{\n"
        f"        kubeconfig {admin_kubeconfig()} volcano-local\n        pods insecure\n    }}\n}}\n"
    )
    return [str(binary("coredns")), f"-conf={corefile}"]


def dns_serving() -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex((BRIDGE_IP, 53)) == 0


def config_file(component: str, body: dict) -> Path:
    """A component's configuration file, in its own state directory."""
    directory = STATE / component
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.json"
    path.write_text(json.dumps(body, indent=2))
    return path


def kubelet_argv() -> list[str]:
    config = config_file("kubelet", {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": BRIDGE_IP,
        "port": PORTS["kubelet"],
        "healthzBindAddress": HOST,
        "healthzPort": PORTS["kubelet-healthz"],
        "readOnlyPort": 0,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": pki_path("ca.crt")}},
        "authorization": {"mode": "AlwaysAllow"},
        "cgroupDriver": "cgroupfs",  # cgroup v1 here, no systemd
        # Kubelets from v1.35 refuse to start on a cgroup v1 host unless told (the field's default
        # turned true then); every Kubernetes release here (from v1.31) has it, false by default.
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{containerd_socket()}",
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [BRIDGE_IP],
        "resolvConf": "",  # pods get cluster DNS only, not this machine's search domains
        "podLogsDir": str(STATE / "pod-logs"),
        # The images cannot be pulled again: never collect them, and evict only when really short.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%",
                         "imagefs.available": "1%"},
        "enforceNodeAllocatable": [],
        "registerWithTaints": [{"key": NODE_KIND_LABEL, "value": "real", "effect": "NoSchedule"}],
        "serializeImagePulls": False,
        **image_verification(),
    })
    directory = config.parent
    return [str(binary("kubelet")), f"--config={config}", f"--kubeconfig={admin_kubeconfig()}",
            f"--root-dir={directory / 'root'}", f"--cert-dir={directory / 'pki'}",
            f"--hostname-override={REAL_NODE}", f"--node-ip={BRIDGE_IP}",
            f"--node-labels={NODE_KIND_LABEL}=real", "--v=1"]


def image_verification() -> dict:
    """The images this node holds without a registry (the pause and training images, imported into
    containerd) stay usable as they are. From Kubernetes v1.35 the kubelet checks, for an image already
    on the node, that the pod may pull it (KubeletEnsureSecretPulledImages, on by default): an image
    nothing pulled is "preloaded" and exempt, but once a pod pulls the same image (its digest) from a
    registry (tests/integration/registry.py serves the training image), it no longer is, and a pod
    naming it by its local name makes the kubelet pull that name, from a registry that does not exist.
    Earlier releases have the setting only behind that gate (off), so it is set from v1.35 on."""
    if release_key(VERSIONS.kubernetes) < (1, 35):
        return {}
    return {"imagePullCredentialsVerificationPolicy": "NeverVerifyAllowlistedImages",
            "preloadedImagesVerificationAllowlist": ["localhost/airflow-volcano/*"]}


def real_node_placement() -> dict:
    """The operator arguments that put a pod on the real node with the local training image."""
    return {
        "node_selector": {NODE_KIND_LABEL: "real"},
        "tolerations": [{"key": NODE_KIND_LABEL, "operator": "Equal", "value": "real", "effect": "NoSchedule"}],
        "image": volcano_images.TRAINING.reference,
        "image_pull_policy": "IfNotPresent",
    }


def kube_scheduler_argv() -> list[str]:
    """Kubernetes' own scheduler beside Volcano's, as in a cluster Volcano is added to: it places the
    pods that name no scheduler (Airflow's own, deployed in the cluster); Volcano's Jobs name Volcano's."""
    return [str(binary("kube-scheduler")), f"--kubeconfig={admin_kubeconfig()}",
            f"--authentication-kubeconfig={admin_kubeconfig()}", f"--authorization-kubeconfig={admin_kubeconfig()}",
            "--leader-elect=false", f"--bind-address={HOST}", f"--secure-port={PORTS['kube-scheduler']}"]


def kube_scheduler_serving() -> bool:
    insecure = ssl.create_default_context()
    insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE  # its own self-signed certificate
    try:
        return urllib.request.urlopen(f"https://{HOST}:{PORTS['kube-scheduler']}/healthz", timeout=2,
                                      context=insecure).status == 200
    except OSError:
        return False


def kube_proxy_argv() -> list[str]:
    config = config_file("kube-proxy", {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": admin_kubeconfig()},
        "hostnameOverride": REAL_NODE,
        "mode": "iptables",
        "clusterCIDR": POD_SUBNET,
        "healthzBindAddress": f"{HOST}:{PORTS['kube-proxy-healthz']}",
        "metricsBindAddress": f"{HOST}:{PORTS['kube-proxy-metrics']}",
        # NodePorts on the pod bridge only, never on the machine's own network.
        "nodePortAddresses": [f"{BRIDGE_IP}/32"],
        "conntrack": {"maxPerCore": 0},  # leave the host's conntrack table size as it is
    })
    return [str(binary("kube-proxy")), f"--config={config}", "--v=1"]


def kube_proxy_serving() -> bool:
    try:
        return urllib.request.urlopen(f"http://{HOST}:{PORTS['kube-proxy-healthz']}/healthz", timeout=2).status == 200
    except OSError:
        return False


def remove_kube_proxy_rules() -> None:
    """kube-proxy's iptables chains outlive it: `kube-proxy --cleanup` removes them."""
    for proxy in sorted((CACHE_ROOT / "bin").glob("kubernetes-*/kube-proxy")):
        if subprocess.run([str(proxy), "--cleanup"], capture_output=True).returncode == 0:
            return


def real_node_ready() -> bool:
    return kubectl("get", "node", REAL_NODE, "-o",
                   'jsonpath={.status.conditions[?(@.type=="Ready")].status}') == "True"


def create_simulated_nodes() -> None:
    items = []
    for node in NODES:
        resources = {"cpu": node["cpu"], "memory": node["memory"], "pods": node["pods"],
                     "nvidia.com/gpu": node["gpu"]}
        items.append({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node["name"], "annotations": {"kwok.x-k8s.io/node": "fake"},
                         "labels": {"kubernetes.io/hostname": node["name"], "kubernetes.io/os": "linux",
                                    "type": "kwok", NODE_KIND_LABEL: "simulated"}},
            "status": {"allocatable": resources, "capacity": resources},
        })
    kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    wait_for("kwok", "simulated nodes Ready", simulated_nodes_ready)


def simulated_nodes_ready() -> bool:
    out = kubectl("get", "nodes", "-l", f"{NODE_KIND_LABEL}=simulated", "-o",
                  'jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\\n"}{end}')
    statuses = out.split()
    return len(statuses) == len(NODES) and all(status == "True" for status in statuses)


ALL_COMPONENTS = [
    Component("etcd", etcd_argv, ("etcd health", lambda: urllib.request.urlopen(
        f"http://{HOST}:{PORTS['etcd']}/health", timeout=2).status == 200), ready_timeout=30, port=PORTS["etcd"]),
    Component("kube-apiserver", apiserver_argv, ("kube-apiserver /readyz", lambda: api_get("/readyz") == b"ok"),
              setup=install_crds_and_webhooks, port=PORTS["apiserver"]),
    Component("kube-controller-manager", controller_manager_argv),
    Component("vc-webhook-manager", webhook_argv, ("the admission webhook to serve", lambda: webhook_serving()),
              ready_timeout=60, port=PORTS["webhook"]),
    Component("kwok", kwok_argv, ("kwok to serve", lambda: port_open(PORTS["kwok"])),
              setup=create_simulated_nodes, port=PORTS["kwok"]),
    Component("vc-controller-manager", vc_controller_argv),
    Component("vc-scheduler", vc_scheduler_argv, ("the default queue to be Open", default_queue_open)),
    Component("containerd", containerd_argv, ("containerd to serve", containerd_serving), ready_timeout=30,
              prepare=prepare_network, setup=containerd_setup, before_stop=remove_containers, real_node=True),
    Component("coredns", coredns_argv, ("CoreDNS to serve", dns_serving), ready_timeout=30, real_node=True),
    Component("kubelet", kubelet_argv, (f"node {REAL_NODE} Ready", real_node_ready), ready_timeout=120,
              port=PORTS["kubelet"], real_node=True),
    Component("kube-scheduler", kube_scheduler_argv, ("kube-scheduler to serve", kube_scheduler_serving),
              ready_timeout=60, port=PORTS["kube-scheduler"], real_node=True),
    # Services' ClusterIPs for the real node's pods (the `kubernetes` Service first: in-cluster clients).
    Component("kube-proxy", kube_proxy_argv, ("kube-proxy to sync", kube_proxy_serving), ready_timeout=60,
              port=PORTS["kube-proxy-healthz"], real_node=True),
]
COMPONENTS = [component for component in ALL_COMPONENTS if not (SIMULATED_ONLY and component.real_node)]
BY_NAME = {component.name: component for component in COMPONENTS}


# ---------------------------------------------------------------------------------------------
# up / down / status / restart
# ---------------------------------------------------------------------------------------------


def healthy() -> bool:
    if any(running_pid(component.name) is None for component in COMPONENTS):
        return False
    try:
        return api_get("/readyz") == b"ok" and (SIMULATED_ONLY or real_node_ready())
    except Exception:  # noqa: BLE001
        return False


def api_answers() -> bool:
    try:
        return api_get("/readyz") == b"ok"
    except Exception:  # noqa: BLE001
        return False


def up() -> Path:
    kubeconfig = STATE / "kubeconfig"
    running = running_versions()
    if healthy() and running == VERSIONS:
        log(f"already running ({VERSIONS.describe()})")
        return kubeconfig
    if running == VERSIONS and kubeconfig.exists() and api_answers():
        # Degraded, not gone (a component stopped: a crash, or a test's fault): start what is missing,
        # keeping the cluster's state (its objects, its certificates, other sessions' kubeconfigs).
        for component in COMPONENTS:
            if running_pid(component.name) is None:
                restart(component.name)
        deadline = time.monotonic() + 120  # a restarted kubelet's node turns Ready within seconds
        while time.monotonic() < deadline:
            if healthy():
                return kubeconfig
            time.sleep(1)
        log("the repaired cluster is not healthy; starting it anew")
        down(quiet=True)
    elif running is not None and running != VERSIONS and STATE.exists():
        log(f"a cluster of {running.describe()} runs; stopping it for {VERSIONS.describe()}")
        down(quiet=True)
    elif STATE.exists():
        log("found a partial cluster; stopping it first")
        down(quiet=True)
    if os.geteuid() != 0 and not SIMULATED_ONLY:
        raise ClusterError("the real node (containerd, kubelet, pod network) needs root: run this as root")
    build()
    started = time.monotonic()
    pki = STATE / "pki"
    make_pki(pki)
    write_kubeconfig(pki, kubeconfig)
    (STATE / "versions.json").write_text(json.dumps(VERSIONS.__dict__))
    for component in COMPONENTS:
        launch(component)
        if component.setup:
            component.setup()
    wait_for("kube-controller-manager", "the default ServiceAccount", default_service_account_exists)
    log(f"cluster up in {time.monotonic() - started:.1f}s ({VERSIONS.describe()})")
    return kubeconfig


def launch(component: Component) -> None:
    if component.prepare:
        component.prepare()
    start(component.name, component.argv())
    if component.ready:
        what, check = component.ready
        wait_for(component.name, what, check, timeout=component.ready_timeout)


def webhook_serving() -> bool:
    context = ssl.create_default_context(cafile=str(STATE / "pki" / "ca.crt"))
    try:
        urllib.request.urlopen(f"https://{HOST}:{PORTS['webhook']}/healthz", context=context, timeout=2)
    except urllib.error.HTTPError:
        return True  # it answered over TLS: it is serving
    return True


def apply_webhook_configurations(pki: Path) -> None:
    ca_bundle = b64(pki / "ca.crt")
    documents = []
    for path, (kind, group, version, resource, operations) in enabled_webhooks().items():
        name = "volcano-admission-service" + path.replace("/", "-")
        webhook = {
            "name": f"{path.strip('/').replace('/', '-')}.volcano.sh",
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": f"https://{HOST}:{PORTS['webhook']}{path}", "caBundle": ca_bundle},
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "namespaceSelector": {"matchExpressions": [{
                "key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]},
            "rules": [{"apiGroups": [group], "apiVersions": [version], "operations": operations,
                       "resources": [resource], "scope": "*"}],
            "sideEffects": "NoneOnDryRun",
            "timeoutSeconds": 10,
        }
        if kind == "mutating":
            webhook["reinvocationPolicy"] = "Never"
        documents.append({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration" if kind == "mutating" else "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [webhook],
        })
    kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}))


def stop_process(name: str, pid: int) -> None:
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while running_pid(name) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    if running_pid(name) is not None:
        os.kill(pid, signal.SIGKILL)
        while running_pid(name) is not None:
            time.sleep(0.05)


def down(quiet: bool = False) -> None:
    for component in reversed(COMPONENTS):
        pid = running_pid(component.name)
        if pid is None:
            continue
        if component.before_stop:
            try:
                component.before_stop()
            except ClusterError as error:
                log(f"{component.name}: {error}")
        stop_process(component.name, pid)
        if not quiet:
            log(f"stopped {component.name} (pid {pid})")
    if not SIMULATED_ONLY:  # the host's pod network and cgroups are the first cluster's
        remove_real_node_leftovers()
    shutil.rmtree(STATE, ignore_errors=True)


def remove_real_node_leftovers() -> None:
    """What the kubelet and CNI leave on the host: mounts, pod network namespaces, cgroups, the bridge."""
    state = str(STATE) + "/"
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for mount in sorted({m for m in mounts if m.startswith(state)}, key=len, reverse=True):
        if subprocess.run(["umount", mount], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", mount], capture_output=True)
    netns = Path("/var/run/netns")
    for namespace in sorted(netns.glob("cni-*")) if netns.exists() else []:
        addresses = subprocess.run(["ip", "netns", "exec", namespace.name, "ip", "-4", "-o", "addr"],
                                   capture_output=True, text=True).stdout
        if f" {POD_SUBNET.rsplit('.', 1)[0]}." in addresses:
            subprocess.run(["ip", "netns", "delete", namespace.name], capture_output=True)
    for kubepods in Path("/sys/fs/cgroup").glob("*/kubepods"):
        # Deepest first; a cgroup that still holds a process stays (and is reported by the kernel as busy).
        for directory in sorted((kubepods, *(p for p in kubepods.rglob("*") if p.is_dir())),
                                key=lambda p: -len(p.parts)):
            try:
                directory.rmdir()
            except OSError:
                pass
    subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True)
    remove_kube_proxy_rules()


def port_open(port: int, host: str = HOST) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex((host, port)) == 0


def stop(name: str) -> None:
    """Kill one component as a crash would (tests: a kubelet that stops answering); `restart` brings it back."""
    if BY_NAME.get(name) is None:
        raise ClusterError(f"no component {name!r} (components: {', '.join(BY_NAME)})")
    pid = running_pid(name)
    if pid is None:
        raise ClusterError(f"{name} is not running")
    os.kill(pid, signal.SIGKILL)
    while running_pid(name) is not None:
        time.sleep(0.05)
    log(f"stopped {name} (pid {pid}, SIGKILL)")


def restart(name: str) -> None:
    """Stop one component and start it again as it was (tests: an apiserver restart mid-wait)."""
    argv_file = STATE / "pids" / f"{name}.argv"
    component = BY_NAME.get(name)
    if component is None or not argv_file.exists():
        raise ClusterError(f"no running component {name!r} (components: {', '.join(BY_NAME)})")
    pid = running_pid(name)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
        while running_pid(name) is not None:
            time.sleep(0.05)
    if component.port is not None:  # the old listener must be gone before the new one binds
        host = BRIDGE_IP if component.real_node else HOST
        deadline = time.monotonic() + 20
        while port_open(component.port, host) and time.monotonic() < deadline:
            time.sleep(0.1)
    start(name, json.loads(argv_file.read_text()))
    if component.ready:
        what, check = component.ready
        wait_for(name, what, check, timeout=component.ready_timeout)
    log(f"restarted {name}")


def status() -> int:
    ok = True
    running = running_versions()
    print(f"{'versions':26} {running.describe() if running else 'unknown (no cluster)'}")
    for component in COMPONENTS:
        pid = running_pid(component.name)
        ok &= pid is not None
        print(f"{component.name:26} {'running (pid ' + str(pid) + ')' if pid else 'not running'}")
    checks = {"api /readyz": lambda: api_get("/readyz") == b"ok", "simulated nodes": simulated_nodes_ready}
    if not SIMULATED_ONLY:
        checks |= {f"node {REAL_NODE}": real_node_ready, f"bridge {BRIDGE}": bridge_mac_is_fixed}
    for what, check in checks.items():
        try:
            good = bool(check())
        except Exception:  # noqa: BLE001
            good = False
        ok &= good
        print(f"{what:26} {'ok' if good else 'not ready'}")
    return 0 if ok else 1


def version_options(args: list[str]) -> dict[str, str]:
    """`--volcano V --kubernetes V` (or `--volcano=V`) as chosen_versions' arguments."""
    options: dict[str, str] = {}
    rest = list(args)
    while rest:
        flag = rest.pop(0)
        name, _, value = flag.partition("=")
        if name.removeprefix("--") not in VERSION_ENV or not name.startswith("--"):
            raise ClusterError(f"unknown option {flag!r} (options: --volcano V, --kubernetes V)")
        if not value:
            if not rest:
                raise ClusterError(f"{name} needs a version, e.g. {name} v1.10.0")
            value = rest.pop(0)
        options[name.removeprefix("--")] = value
    return options


def main(args: list[str]) -> int:
    """The command line of scripts/volcano-cluster (the executable that calls this), without the program
    name: runs one command and returns the exit code. The module docstring is its usage text."""
    global VERSIONS
    command = args[0] if args else ""
    try:
        if command in ("up", "build"):
            VERSIONS = chosen_versions(**version_options(args[1:]))
        if command == "up":
            print(up())
        elif command == "down":
            down()
        elif command == "status":
            return status()
        elif command == "kubeconfig":
            path = STATE / "kubeconfig"
            if not path.exists():
                print("no cluster: run `scripts/volcano-cluster up`", file=sys.stderr)
                return 1
            print(path)
        elif command == "real-node":
            if SIMULATED_ONLY:
                raise ClusterError("this cluster (VOLCANO_CLUSTER_SIMULATED=1) has no real node")
            print(json.dumps(real_node_placement(), indent=2))
        elif command == "build":
            build()
        elif command == "versions":
            for project in VERSION_ENV:
                print(f"{project:12} {' '.join(known_versions(project))} (default {resolve_version(project, None)})")
        elif command == "restart" and len(args) > 1:
            restart(args[1])
        elif command == "stop" and len(args) > 1:
            stop(args[1])
        elif command == "scheduler" and len(args) > 1:
            set_scheduler(args[1])
        else:
            print(__doc__.strip(), file=sys.stderr)
            return 2
    except ClusterError as error:
        print(f"[volcano-cluster] ERROR: {error}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as error:
        print(f"[volcano-cluster] ERROR: {error}\n{error.stderr or ''}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
