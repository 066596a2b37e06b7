"""Real schedulers on localhost for the cluster-job tests: a one-node Slurm cluster (Debian's
slurm-wlm with munge) and a Ray head, every file they write under one temporary folder.

Nothing here mocks a scheduler: munged, slurmctld and slurmd are the packaged daemons, started
with a slurm.conf written for this host, and jobs go through `sbatch`; the Ray head is
`ray start --head` and jobs go through `ray job submit`."""

from __future__ import annotations

import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol")
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, timeout_s: float, what: str, poll_s: float = 0.5):
    """Poll `condition()` until it returns something truthy; its value. TimeoutError naming
    `what` (and the last value) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    value = None
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    raise TimeoutError(f"waited {timeout_s:.0f} s for {what}; last seen: {value!r}")


def missing_slurm() -> list[str]:
    for folder in ("/usr/sbin", "/sbin"):  # daemons are not on a plain user's PATH
        if folder not in os.environ.get("PATH", "").split(":"):
            os.environ["PATH"] = os.environ.get("PATH", "") + ":" + folder
    return [b for b in SLURM_BINARIES if shutil.which(b) is None]


SLURM_CONF = """\
ClusterName=molcap-test
SlurmctldHost={host}
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser={user}
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
ReturnToService=2
MinJobAge=3600
MpiDefault=none
NodeName={host} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class SlurmCluster:
    """A running one-node cluster: `sbatch` jobs, read their state, stop every daemon."""

    root: Path
    env: dict
    daemons: list = field(default_factory=list)
    jobs: list = field(default_factory=list)

    def run(self, *args, check=True) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True,
                              check=check, timeout=120)

    def sbatch(self, script: Path, *options: str, env: dict | None = None) -> str:
        """Submit `script`; its job id. `env`: the submitting environment (--export=ALL)."""
        done = subprocess.run(["sbatch", "--parsable", *options, str(script)],
                              env={**(env or os.environ), "SLURM_CONF": self.env["SLURM_CONF"]},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"sbatch failed: {done.stderr}"
        self.jobs.append(done.stdout.strip().split(";")[0])
        return self.jobs[-1]

    def job(self, job_id: str) -> dict:
        """`scontrol show job` as a dict (JobState, ExitCode, StdOut, ...)."""
        text = self.run("scontrol", "show", "job", "--oneliner", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait(self, job_id: str, timeout_s: float) -> dict:
        """Wait for the job to reach a final state; its record."""
        return wait_for(lambda: (lambda j: j if j.get("JobState") in FINAL_STATES else None)(
            self.job(job_id)), timeout_s, f"Slurm job {job_id} to finish", poll_s=2)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in
                         sorted(self.root.glob("*.log")))

    def stop(self) -> None:
        """Cancel the jobs still running (their processes are slurmd's, not ours: a job left
        running would outlive the daemons), then stop the daemons."""
        if self.daemons and self.jobs:
            self.run("scancel", *self.jobs, check=False)
            try:
                for job_id in self.jobs:
                    self.wait(job_id, 60)
            except (TimeoutError, subprocess.SubprocessError):
                pass  # the daemons are stopped all the same
        for proc in reversed(self.daemons):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.daemons):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        self.daemons.clear()


def start_slurm(root: Path, timeout_s: float = 120) -> SlurmCluster:
    """munged, slurmctld and slurmd in the foreground as children of this process, their
    sockets, state, spool, pid and log files under `root`; waits until the node is idle."""
    import getpass

    root.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname().split(".")[0]
    for sub in ("munge", "state", "spool"):
        (root / sub).mkdir(mode=0o700, exist_ok=True)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    conf = root / "slurm.conf"
    conf.write_text(SLURM_CONF.format(host=host, root=root, user=getpass.getuser(),
                                      ctld_port=free_port(), d_port=free_port()))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = SlurmCluster(root, env)
    quiet = dict(env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        cluster.daemons.append(subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={root}/munge/munge.socket",
             f"--key-file={key}", f"--pid-file={root}/munge/munged.pid",
             f"--log-file={root}/munged.log", f"--seed-file={root}/munge/munged.seed"], **quiet))
        wait_for(lambda: (root / "munge" / "munge.socket").exists(), timeout_s, "munged")
        cluster.daemons.append(subprocess.Popen(["slurmctld", "-D", "-i"], **quiet))
        wait_for(lambda: cluster.run("scontrol", "ping", check=False).returncode == 0,
                 timeout_s, "slurmctld to answer")
        cluster.daemons.append(subprocess.Popen(["slurmd", "-D"], **quiet))
        wait_for(lambda: "IDLE" in cluster.run("scontrol", "show", "node", host,
                                               check=False).stdout, timeout_s,
                 "the node to be IDLE")
    except BaseException as error:
        cluster.stop()
        raise RuntimeError(f"{error}\n{cluster.logs()}") from error
    return cluster


@dataclass
class RayHead:
    """A local Ray head started by `ray start --head`; `ray job submit` to its dashboard."""

    address: str
    env: dict
    ray_bin: Path

    def submit(self, *entrypoint: str, working_dir: Path, timeout_s: float,
               env_vars: dict | None = None) -> subprocess.CompletedProcess:
        """`ray job submit` (waits for the job and streams its logs); the finished process."""
        import json

        runtime = json.dumps({"env_vars": env_vars or {}})
        return subprocess.run(
            [str(self.ray_bin), "job", "submit", "--address", self.address, "--working-dir",
             str(working_dir), "--runtime-env-json", runtime, "--", *entrypoint],
            env=self.env, capture_output=True, text=True, timeout=timeout_s)


def start_ray(root: Path, ray_bin: Path, timeout_s: float = 300) -> tuple[RayHead, callable]:
    """`ray start --head --block` on free ports with 2 CPUs, its temp folder under `root`, in a
    process group of its own; the head and a function that stops that group (never `ray stop`,
    which would stop every Ray instance of the machine)."""
    root.mkdir(parents=True, exist_ok=True)
    dashboard = free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    # Token authentication as Ray enables it by default, with this head's own token (never the
    # user's ~/.ray/auth_token).
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token",
               RAY_AUTH_TOKEN=secrets.token_hex(32))
    # Ray's socket paths must stay under 107 bytes: a short temp folder of its own.
    temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    log = (root / "ray-head.log").open("w")
    # Every port on a free one, not Ray's fixed defaults: a second head on the machine (another
    # test run beside this one) otherwise finds its job agent's port taken and refuses jobs
    # ("No available agent to submit job").
    ports = [f"--{name}={free_port()}" for name in (
        "port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port",
        "ray-client-server-port", "node-manager-port", "object-manager-port",
        "runtime-env-agent-port")]
    workers = random.randrange(20_000, 30_000, 100)
    proc = subprocess.Popen(
        [str(ray_bin), "start", "--head", "--block", *ports, f"--min-worker-port={workers}",
         f"--max-worker-port={workers + 99}", "--num-cpus=2", "--num-gpus=0",
         "--include-dashboard=true", "--dashboard-host=127.0.0.1",
         f"--dashboard-port={dashboard}", f"--temp-dir={temp}", "--disable-usage-stats"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def stop():
        for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
            time.sleep(1)  # the group's other members get the same signal
        log.close()
        shutil.rmtree(temp, ignore_errors=True)

    address = f"http://127.0.0.1:{dashboard}"
    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with status {proc.returncode}")
        return subprocess.run([str(ray_bin), "job", "list", "--address", address], env=env,
                              capture_output=True, timeout=60).returncode == 0

    try:
        wait_for(ready, timeout_s, "the Ray job server", poll_s=2)
    except BaseException as error:
        stop()
        raise RuntimeError(f"{error}\n{(root / 'ray-head.log').read_text()[-3000:]}") from error
    return RayHead(address, env, ray_bin), stop
