"""k8s/Dockerfile builds the images the manifests name, each with only its side's wheels.

The manifests name `vidroute-controlplane` and `vidroute-adapter` (tests/unit/k8s/
test_manifests.py); here each is a build target of the Dockerfile whose venv installs exactly
vidroute-core plus that side's distribution (packaging/, scripts/build_dists.py), every
Deployment's command is a console script of what its image installs, and every source path a
wheel is built from is copied into the build stage and let through the .dockerignore.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from scripts.build_dists import NAMES, pyproject, stage_paths, wheel_name

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "k8s"
# Image -> (its Dockerfile target, the distributions it installs). The contract suite and the
# emulators (vidroute-adapter-contract) are test tooling and ship in no image.
TARGETS = {
    "vidroute-controlplane": ("controlplane", {"core", "client", "controlplane"}),
    "vidroute-adapter": ("adapter", {"core", "adapters"}),
}
# The stand-in self-hosted model on a Cog server (k8s/base/model-cog-video): no vidroute wheel.
MODEL_IMAGE, MODEL_TARGET = "vidroute-model-cog-video", "model-cog-video"


def stages() -> dict[str, str]:
    """Stage name -> its instructions, continuation lines joined."""
    text = (K8S / "Dockerfile").read_text().replace("\\\n", " ")
    found: dict[str, str] = {}
    name = ""
    for line in text.splitlines():
        match = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.IGNORECASE)
        if match:
            name = match.group(1)
            found[name] = ""
        elif name and line.strip() and not line.lstrip().startswith("#"):
            found[name] += line.strip() + "\n"
    return found


def installed_distributions(target: str) -> set[str]:
    """The packaging/ names whose wheels the venv copied into `target` installs."""
    venv_stage = re.search(r"COPY --from=(\S+) /opt/vidroute /opt/vidroute", stages()[target])
    assert venv_stage, f"{target} copies no venv"
    wheels = set(re.findall(r"/wheels/(\S+\.whl)", stages()[venv_stage.group(1)]))
    by_wheel = {wheel_name(n): n for n in NAMES}
    assert wheels <= set(by_wheel), f"{target} installs unknown wheels {wheels - set(by_wheel)}"
    return {by_wheel[w] for w in wheels}


def deployment_commands() -> dict[str, list[list[str]]]:
    """Image name -> the commands of the base Deployments' containers that run it (ours: Envoy
    runs upstream's image, checked in test_envoy_config)."""
    commands: dict[str, list[list[str]]] = {}
    for path in sorted((K8S / "base").glob("*/deployment.yaml")):
        if path.parent.name == "envoy":
            continue
        deployment = yaml.safe_load(path.read_text())
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            image = container["image"].partition(":")[0]
            commands.setdefault(image, []).append(container["command"])
    return commands


def test_the_manifests_name_exactly_the_images_the_dockerfile_builds() -> None:
    assert set(deployment_commands()) == set(TARGETS) | {MODEL_IMAGE}
    for target, _ in TARGETS.values():
        assert target in stages()


def test_the_model_server_image_runs_the_stand_in_model_on_the_pinned_cog() -> None:
    """vidroute-model-cog-video: coglet and the predictor's packages from constraints.txt, the
    models/cog_video predictor (let through the .dockerignore), its venv first on PATH (coglet
    spawns the worker with that python), and the manifest's command is coglet's server."""
    stage = stages()[MODEL_TARGET]
    venv = re.search(r"COPY --from=(\S+) /opt/vidroute /opt/vidroute", stage)
    assert venv
    install = stages()[venv.group(1)]
    assert "-c /tmp/constraints.txt" in install
    pins = (ROOT / "constraints.txt").read_text()
    model_needs = yaml.safe_load((ROOT / "models/cog_video/cog.yaml").read_text())
    for package in [
        "cog",
        "coglet",
        *(p.split("==")[0] for p in model_needs["build"]["python_packages"]),
    ]:
        assert re.search(rf"\b{package}\b", install), package
        assert re.search(rf"^{package}==", pins, re.MULTILINE), package
    assert "COPY models/cog_video /srv/model" in stage
    assert "COG_PREDICT_TYPE_STUB=/srv/model/predict.py:Predictor" in stage
    assert "FROM runtime AS model-cog-video" in (K8S / "Dockerfile").read_text()  # venv on PATH
    ignore = (K8S / "Dockerfile.dockerignore").read_text().splitlines()
    assert "!models/cog_video/" in ignore
    assert deployment_commands()[MODEL_IMAGE] == [
        ["python", "-m", "cog.server.http", "--host", "0.0.0.0"]
    ]


@pytest.mark.parametrize("image", sorted(TARGETS))
def test_each_image_installs_only_its_side(image: str) -> None:
    """vidroute-controlplane installs no sidecar wheel, vidroute-adapter no control plane one."""
    target, distributions = TARGETS[image]
    assert installed_distributions(target) == distributions


@pytest.mark.parametrize("image", sorted(TARGETS))
def test_every_deployment_command_is_a_script_of_its_image(image: str) -> None:
    """`vidroute serve`, `vidroute-adapter-<provider>`: entry points the image really has."""
    distributions = installed_distributions(TARGETS[image][0])
    scripts = {s for n in distributions for s in pyproject(n)["project"].get("scripts", {})}
    for command in deployment_commands()[image]:
        assert command[0] in scripts, (image, command)


def test_the_build_stage_has_every_source_path_its_wheels_need() -> None:
    """Each built distribution's staged paths are COPYed and not excluded by .dockerignore."""
    [built] = re.findall(r"build_dists\.py --out /wheels ((?:\w+ ?)+)", stages()["wheels"])
    names = built.split()
    assert set(names) >= {n for _, dists in TARGETS.values() for n in dists}
    copied = set(re.findall(r"^COPY (\S+) ", stages()["wheels"], re.MULTILINE))
    ignore = (K8S / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line.removeprefix("!").rstrip("/") for line in ignore if line.startswith("!")}
    for name in names:
        for path in ["packaging", "scripts/build_dists.py", *stage_paths(name)]:
            assert any(path == c or path.startswith(f"{c}/") for c in copied), (name, path)
            assert any(path == a or path.startswith(f"{a}/") for a in allowed), (name, path)


@pytest.mark.parametrize("name", NAMES)
def test_every_dependency_of_a_wheel_is_pinned_by_the_constraints(name: str) -> None:
    """The images install with `-c constraints.txt`: each third-party requirement of each
    distribution has a pin there that its range accepts, and our own are pinned to the release."""
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            dist, _, version = line.partition("==")
            pins[canonicalize_name(dist)] = version
    ours = {canonicalize_name(pyproject(n)["project"]["name"]) for n in NAMES}
    version = pyproject(name)["project"]["version"]
    for requirement in map(Requirement, pyproject(name)["project"]["dependencies"]):
        dist = canonicalize_name(requirement.name)
        if dist in ours:
            assert str(requirement.specifier) == f"=={version}", requirement
        else:
            assert dist in pins, f"{requirement} has no pin in constraints.txt"
            assert requirement.specifier.contains(pins[dist]), (requirement, pins[dist])
