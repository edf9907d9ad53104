"""Print the dependencies declared in pyproject.toml, one per line, for `pip install`.

The Makefile installs them before the editable build so that a change to the C++ code
re-runs only the build, never the dependency resolution.
"""

import argparse
import tomllib


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("pyproject")
    parser.add_argument("--extra", action="append", default=[])
    args = parser.parse_args()
    with open(args.pyproject, "rb") as f:
        project = tomllib.load(f)["project"]
    deps = list(project.get("dependencies", []))
    for extra in args.extra:
        deps += project.get("optional-dependencies", {}).get(extra, [])
    print("\n".join(deps))


if __name__ == "__main__":
    main()
