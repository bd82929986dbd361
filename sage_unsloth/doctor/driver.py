"""The NVIDIA driver against the CUDA 13 builds the kit pins (torch 2.13, vLLM 0.31), and what to do below 580.

The CUDA driver they load (libcuda.so.1) must be from release 580 or newer. Below that, a data-centre GPU (T4, L4,
A10G, A100, H100: every card Colab and Kaggle lend) can still run them through NVIDIA's CUDA forward-compatibility
package, cuda-compat-13-0: the 580 user-mode driver, installed beside the old kernel module and put first on
LD_LIBRARY_PATH. Consumer cards (GeForce, RTX, Quadro, TITAN) have no forward compatibility: update the driver.
Whether the package runs over a given kernel module is settled by loading it (cuInit: 803 where that driver branch
is not supported, 804 on a card without forward compatibility), so :func:`enable_forward_compat` checks it in a
fresh process before anything relies on it. Sources: docs.nvidia.com/deploy/cuda-compatibility/forward-compatibility.html
and docs/troubleshooting.md#the-nvidia-driver.

Standard library only: notebooks/build.py copies this file into the notebooks' first cell, which runs before the kit
is installed (``first_contact()``); ``python -m sage_unsloth.doctor.driver [--enable]`` runs it in a shell.
"""

import os
import subprocess
import sys

MIN_DRIVER = 580  # the oldest driver release whose libcuda runs CUDA 13.x
CUDA_MAJOR = 13
COMPAT_PACKAGE = "cuda-compat-13-0"
COMPAT_DIR = "/usr/local/cuda-13.0/compat"
NO_FORWARD_COMPAT = ("GeForce", "RTX", "Quadro", "TITAN")
KEYRING = (
    "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/x86_64/cuda-keyring_1.1-1_all.deb"
)
NEWER_RUNTIME = (
    "use a machine whose NVIDIA driver is >= 580 (Kaggle: Settings > Environment > Always use latest "
    "environment; Colab: Runtime > Change runtime type > Runtime version > Latest)"
)
# A child reads the CUDA driver that LD_LIBRARY_PATH gives it: cuInit's result and the driver API version.
PROBE = (
    "import ctypes; c = ctypes.CDLL('libcuda.so.1'); v = ctypes.c_int(0); r = c.cuInit(0); "
    "c.cuDriverGetVersion(ctypes.byref(v)); print(r, v.value)"
)


def driver_major(version):
    head = str(version or "").split(".")[0]
    return int(head) if head.isdigit() else None


def forward_compatible(gpu_name):
    """NVIDIA ships forward compatibility for data-centre GPUs only."""
    return not any(word.lower() in str(gpu_name).lower() for word in NO_FORWARD_COMPAT)


def advice(gpu_name, driver):
    """("ok" | "compat" | "update", one line): what a machine with this GPU and driver does to run CUDA 13."""
    major = driver_major(driver)
    if major is None or major >= MIN_DRIVER:
        return "ok", f"{gpu_name}, driver {driver}: runs CUDA 13"
    if not forward_compatible(gpu_name):
        return "update", (
            f"{gpu_name}, driver {driver}: older than {MIN_DRIVER}, and consumer cards have no CUDA forward "
            f"compatibility: update the NVIDIA driver to >= {MIN_DRIVER}"
        )
    return "compat", (
        f"{gpu_name}, driver {driver}: older than {MIN_DRIVER}; CUDA 13 runs through NVIDIA's forward-compatibility "
        f"package: apt-get install {COMPAT_PACKAGE}, then export LD_LIBRARY_PATH={COMPAT_DIR}:$LD_LIBRARY_PATH "
        f"(the notebooks do both; python -m sage_unsloth.doctor.driver --enable checks it loads)"
    )


def probe_cuda(library_path=None, run=subprocess.run):
    """(cuInit's result, the driver API version) in a fresh Python that loads libcuda from ``library_path`` first;
    (None, None) when it cannot say."""
    env = dict(os.environ)
    if library_path:
        env["LD_LIBRARY_PATH"] = library_path + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    done = run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=False)
    words = (done.stdout or "").split()
    return (int(words[0]), int(words[1])) if done.returncode == 0 and len(words) == 2 else (None, None)


def install_compat(run=subprocess.run):
    """apt-get install the package, adding NVIDIA's CUDA repository first when apt does not know it; returns the
    failing command's last line, or None."""
    steps = [["apt-get", "install", "-y", "-q", COMPAT_PACKAGE]]
    known = run(["apt-cache", "show", COMPAT_PACKAGE], capture_output=True, text=True, check=False)
    if known.returncode != 0:
        with open("/etc/os-release") as lines:
            release = dict(line.strip().split("=", 1) for line in lines if "=" in line)
        distro = release.get("ID", "ubuntu").strip('"') + release.get("VERSION_ID", "").strip('"').replace(
            ".", ""
        )
        deb = "/tmp/cuda-keyring.deb"
        steps = [
            ["curl", "-fsSL", "-o", deb, KEYRING.format(distro=distro)],
            ["dpkg", "-i", deb],
            ["apt-get", "update", "-q"],
            *steps,
        ]
    for step in steps:
        done = run(step, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            lines = (done.stderr or done.stdout or "").strip().splitlines() or [f"exit {done.returncode}"]
            return f"{' '.join(step)}: {lines[-1]}"
    return None


def enable_forward_compat(environ=os.environ, run=subprocess.run, probe=probe_cuda):
    """Install the package, check in a fresh process that CUDA 13 initialises through it, and put it first on
    ``environ``'s LD_LIBRARY_PATH (the stages' processes inherit it); a RuntimeError says the one thing left."""
    if COMPAT_DIR in environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        return f"forward compatibility already on ({COMPAT_DIR} first on LD_LIBRARY_PATH)"
    problem = install_compat(run) if not os.path.isdir(COMPAT_DIR) else None
    if problem:
        raise RuntimeError(f"installing {COMPAT_PACKAGE} failed ({problem}): {NEWER_RUNTIME}")
    status, version = probe(COMPAT_DIR)
    if status != 0 or (version or 0) < 13000:
        why = {
            803: "this kernel driver's branch is not one it supports",
            804: "this GPU has no forward compatibility",
        }
        raise RuntimeError(
            f"NVIDIA's forward-compatibility package does not load here (cuInit {status}: "
            f"{why.get(status, 'no CUDA 13 driver API')}): {NEWER_RUNTIME}"
        )
    environ["LD_LIBRARY_PATH"] = COMPAT_DIR + os.pathsep + environ.get("LD_LIBRARY_PATH", "")
    return f"CUDA 13 runs through {COMPAT_PACKAGE} (driver API {version // 1000}.{version % 1000 // 10}) in every stage"


def first_contact(query=None, environ=os.environ, enable=enable_forward_compat):
    """The notebooks' first cell: the GPU and its driver, and forward compatibility switched on where it is the
    way; a RuntimeError names the one thing to do."""
    query = query or (lambda: subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True, text=True, check=False,
    ).stdout)  # fmt: skip
    rows = [line.split(",") for line in (query() or "").strip().splitlines() if "," in line]
    if not rows:
        raise RuntimeError("no NVIDIA GPU visible: switch the notebook to a GPU runtime (a T4 or newer)")
    name, driver = (part.strip() for part in rows[0][:2])
    verdict, line = advice(name, driver)
    if verdict == "update":
        raise RuntimeError(line + f" ({NEWER_RUNTIME})")
    return (
        line if verdict == "ok" else f"{name}, driver {driver} (older than {MIN_DRIVER}): " + enable(environ)
    )


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv not in ([], ["--enable"]):
        print("usage: python -m sage_unsloth.doctor.driver [--enable]", file=sys.stderr)
        return 2
    enable = (
        enable_forward_compat
        if argv
        else (lambda environ: f"add --enable to install {COMPAT_PACKAGE} and check it loads")
    )
    try:
        print(first_contact(enable=enable))
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if argv and COMPAT_DIR in os.environ.get("LD_LIBRARY_PATH", ""):
        print(f"in your shell: export LD_LIBRARY_PATH={COMPAT_DIR}:$LD_LIBRARY_PATH")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
