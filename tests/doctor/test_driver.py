"""sage_unsloth/doctor/driver.py: what a machine whose NVIDIA driver is older than 580 does to run the CUDA 13 stack
(NVIDIA's forward-compatibility package on a data-centre GPU, checked by loading it; a driver update on a consumer
card), with apt and the probe of a fresh process faked. The notebooks' first cell runs this code
(tests/docs/test_notebooks.py); the doctor's --driver line reads the same rules (test_doctor.py)."""

from __future__ import annotations

import os
import sys
import types

import pytest

from sage_unsloth.doctor import driver


@pytest.mark.parametrize(
    "name, version, verdict",
    [
        ("Tesla T4", "580.65.06", "ok"),
        ("NVIDIA H100 80GB HBM3", "590.44.01", "ok"),
        ("Tesla T4", "550.54.15", "compat"),
        ("NVIDIA A100-SXM4-40GB", "535.183.01", "compat"),
        ("NVIDIA L4", "579.99", "compat"),
        ("NVIDIA GeForce RTX 4090", "550.54.15", "update"),
        ("NVIDIA RTX A6000", "535.54.03", "update"),
        ("Quadro RTX 8000", "470.82.01", "update"),
    ],
)
def test_advice_by_card_and_driver(name, version, verdict):
    got, line = driver.advice(name, version)
    assert got == verdict
    if verdict == "compat":
        assert (
            "apt-get install cuda-compat-13-0" in line
            and "LD_LIBRARY_PATH=/usr/local/cuda-13.0/compat:" in line
        )
    if verdict == "update":
        assert "update the NVIDIA driver to >= 580" in line


class Apt:
    """subprocess.run for apt, curl and dpkg: ``known`` says whether apt knows cuda-compat-13-0 already."""

    def __init__(self, known: bool, failing: str | None = None):
        self.known, self.failing, self.commands = known, failing, []

    def __call__(self, command, **kwargs):
        self.commands.append(" ".join(command))
        bad = (command[0] == "apt-cache" and not self.known) or command[0] == self.failing
        return types.SimpleNamespace(
            returncode=1 if bad else 0, stdout="", stderr="E: no such thing" if bad else ""
        )


def test_install_adds_nvidias_repository_only_when_apt_lacks_the_package(monkeypatch, tmp_path):
    apt = Apt(known=True)
    assert driver.install_compat(apt) is None
    assert apt.commands == ["apt-cache show cuda-compat-13-0", "apt-get install -y -q cuda-compat-13-0"]
    release = tmp_path / "os-release"
    release.write_text('NAME="Ubuntu"\nID=ubuntu\nVERSION_ID="22.04"\n')
    real_open = open
    monkeypatch.setattr(
        "builtins.open", lambda p, *a, **k: real_open(release if p == "/etc/os-release" else p, *a, **k)
    )
    apt = Apt(known=False)
    assert driver.install_compat(apt) is None
    assert "repos/ubuntu2204/x86_64/cuda-keyring_1.1-1_all.deb" in apt.commands[1]
    assert apt.commands[2:] == [
        "dpkg -i /tmp/cuda-keyring.deb",
        "apt-get update -q",
        "apt-get install -y -q cuda-compat-13-0",
    ]
    problem = driver.install_compat(Apt(known=False, failing="dpkg"))
    assert problem == "dpkg -i /tmp/cuda-keyring.deb: E: no such thing"


def test_forward_compat_is_switched_on_only_once_it_loads(monkeypatch):
    monkeypatch.setattr(driver.os.path, "isdir", lambda path: path == driver.COMPAT_DIR)  # installed already
    environ = {"LD_LIBRARY_PATH": "/usr/lib64-nvidia"}
    line = driver.enable_forward_compat(environ, Apt(True), probe=lambda path: (0, 13000))
    assert environ["LD_LIBRARY_PATH"] == "/usr/local/cuda-13.0/compat:/usr/lib64-nvidia"
    assert "driver API 13.0" in line
    assert "already on" in driver.enable_forward_compat(environ, Apt(True), probe=lambda path: (999, 0))
    for status, version, why in ((803, 12040, "branch is not one it supports"), (804, 12040, "no forward compat"),
                                 (0, 12040, "no CUDA 13 driver API"), (None, None, "no CUDA 13 driver API")):  # fmt: skip
        environ = {"LD_LIBRARY_PATH": "/usr/lib64-nvidia"}
        with pytest.raises(RuntimeError, match=why) as caught:
            driver.enable_forward_compat(environ, Apt(True), probe=lambda path, s=status, v=version: (s, v))
        assert environ["LD_LIBRARY_PATH"] == "/usr/lib64-nvidia"  # nothing switched on
        assert "driver is >= 580" in str(caught.value) and "\n" not in str(caught.value)


def test_probe_reads_the_libcuda_the_library_path_gives(monkeypatch):
    seen = {}

    def run(command, env, **kwargs):
        seen.update(command=command, path=env["LD_LIBRARY_PATH"])
        return types.SimpleNamespace(returncode=0, stdout="0 13000\n")

    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/lib64-nvidia")
    assert driver.probe_cuda(driver.COMPAT_DIR, run) == (0, 13000)
    assert seen["command"][0] == sys.executable and "cuDriverGetVersion" in seen["command"][2]
    assert seen["path"].split(os.pathsep)[:2] == [driver.COMPAT_DIR, "/usr/lib64-nvidia"]
    failed = lambda *a, **k: types.SimpleNamespace(returncode=1, stdout="")
    assert driver.probe_cuda(None, failed) == (None, None)


def test_command_line_without_a_gpu(capsys, monkeypatch):
    monkeypatch.setattr(driver.subprocess, "run", lambda *a, **k: types.SimpleNamespace(stdout=""))
    assert driver.main([]) == 1 and "no NVIDIA GPU visible" in capsys.readouterr().err
    assert driver.main(["--bogus"]) == 2
