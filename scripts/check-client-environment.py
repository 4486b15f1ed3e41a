#!/usr/bin/python3
"""Fails when a client reads a COLLECTIVED_ environment variable that rpc/client_environment.h
does not hold, when the table holds one no client reads, or when a client reads the environment
other than through its one reader: collectived.environment.get (Python), ClientSetting (C++),
setting (Go). Other names (LOCAL_RANK, torch's) may be read directly when written as a literal.

    scripts/check-client-environment.py SOURCE_ROOT CLIENT_ENVIRONMENT_EXPORT

The clients are clients/ and rpc/ (C++, Python, Go; tests and generated stubs excluded); a
variable is any quoted "COLLECTIVED_..." string there.
"""

import pathlib
import re
import subprocess
import sys

NAME = re.compile(r"""["'](COLLECTIVED_[A-Z0-9_]+)["']""")
PYTHON_READ = re.compile(r"""os\.(environ|getenv)[^\n]*COLLECTIVED_""")
# A direct read whose name is not a literal other than a COLLECTIVED_ one.
CPP_READ = re.compile(r"""getenv\((?!"(?!COLLECTIVED_)[A-Z0-9_]+"\))""")
GO_READ = re.compile(r"""os\.(?:Getenv|LookupEnv)\((?!"(?!COLLECTIVED_)[A-Z0-9_]+"\))""")


def main(root, exporter):
    table_text = subprocess.run([exporter, "python"], check=True, capture_output=True,
                                text=True).stdout
    table = set(NAME.findall(table_text))
    root = pathlib.Path(root)
    sources = [p for folder in ("clients", "rpc") for p in (root / folder).rglob("*")
               if p.suffix in (".py", ".go", ".cc", ".h") and "_test" not in p.name
               and not p.name.endswith(".pb.go") and "environment_table" not in p.name
               and p.name != "client_environment.h"]
    read = {}
    problems = []
    for path in sources:
        text = path.read_text(encoding="utf-8", errors="replace")
        for name in NAME.findall(text):
            read.setdefault(name, []).append(path.relative_to(root))
        if path.suffix == ".py" and path.name != "environment.py" and PYTHON_READ.search(text):
            problems.append(f"{path.relative_to(root)}: reads a COLLECTIVED_ variable with "
                            "os.environ; use collectived.environment.get")
        if path.suffix in (".cc", ".h") and CPP_READ.search(text):
            problems.append(f"{path.relative_to(root)}: reads the environment with getenv; use "
                            "ClientSetting (rpc/client_environment.h)")
        if path.suffix == ".go" and path.name != "environment.go" and GO_READ.search(text):
            problems.append(f"{path.relative_to(root)}: reads the environment with os.Getenv; use "
                            "setting (environment.go)")
    for name in sorted(set(read) - table):
        problems.append(f"{name} (read in {', '.join(map(str, read[name]))}) is not in "
                        "rpc/client_environment.h")
    for name in sorted(table - set(read)):
        problems.append(f"{name} is in rpc/client_environment.h but no client reads it")
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print(f"check-client-environment: {len(table)} variables, each read and tabled")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
