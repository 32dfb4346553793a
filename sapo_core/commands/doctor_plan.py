"""The install plan (resources/install-plan.toml) as the doctor reads it: the oldest Python the
node runs on and the llama.cpp build flags its fixes name, the same values the installers use."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources

PLAN_FILE = "install-plan.toml"  # in the package sapo_resources (the clone's resources/)


@dataclass(frozen=True)
class InstallPlan:
    python: tuple[int, int]  # the oldest Python, (3, 11)
    torch: str  # the torch version the installers pin
    llama_cpp_python: str  # the llama-cpp-python version the installers build
    llama_flags: str  # llama.cpp's CMake flags on every machine (-DGGML_NATIVE=OFF)
    llama_x86_features: tuple[str, ...]  # x86 features turned on one by one (avx, avx2, ...)

    @property
    def portable_cmake_args(self) -> str:
        """CMake flags that build llama.cpp for any x86-64 CPU with AVX2, not the building one's
        exact features (the native build crashes in AMX kernels on some CPUs: docs/environment.md,
        'llama.cpp build flags')."""
        return " ".join([self.llama_flags, *(f"-DGGML_{f.upper()}=ON" for f in self.llama_x86_features)])


def parse_install_plan(text: str) -> InstallPlan:
    """The plan from its TOML text; KeyError naming a missing key."""
    raw = tomllib.loads(text)
    major, minor = (int(x) for x in raw["python"].split(".")[:2])
    return InstallPlan(
        python=(major, minor),
        torch=raw["torch"],
        llama_cpp_python=raw["llama_cpp_python"],
        llama_flags=raw["llama_flags"],
        llama_x86_features=tuple(raw["llama_x86_features"].split()),
    )


def load_install_plan() -> InstallPlan:
    """The plan shipped with this installation (package data of sapo_resources)."""
    return parse_install_plan(resources.files("sapo_resources").joinpath(PLAN_FILE).read_text(encoding="utf-8"))
