"""The Go client is a Go module: a program outside this tree, in its own module, requires it with
ordinary go.mod commands, builds offline in module mode and runs collectives on a real sidecar."""

import subprocess

from conftest import ROOT
from go_module import CLIENT_MODULE, build_program, go_environment, require_go, run

TRAINER = '''package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"%s/collectived"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, err := collectived.Dial(ctx, os.Args[1])
	if err != nil {
		panic(err)
	}
	defer client.Close()
	if _, err := client.CreateGroup(ctx, collectived.GroupOptions{Name: "outside", Rank: 0, WorldSize: 1}); err != nil {
		panic(err)
	}
	x := collectived.Float32s(1.5, 2.5)
	if err := client.AllReduce("outside", x, collectived.Sum).Wait(ctx); err != nil {
		panic(err)
	}
	fmt.Println("allreduce", x.Float32s())
	if err := client.DestroyGroup(ctx, "outside"); err != nil {
		panic(err)
	}
}
''' % CLIENT_MODULE


def test_a_program_outside_the_tree_builds_with_the_module_and_runs(sidecar, tmp_path):
    require_go()
    binary = build_program(tmp_path / "trainer", "example.com/trainer", TRAINER, tmp_path)
    go_mod = (tmp_path / "trainer/go.mod").read_text()
    assert f"{CLIENT_MODULE} v0.1.0" in go_mod and "google.golang.org/grpc v1.33.3" in go_mod
    modules = (tmp_path / "trainer/vendor/modules.txt").read_text()
    assert f"# {CLIENT_MODULE} v0.1.0\n## explicit; go 1.19\n" in modules
    # Module mode really is on: `go list -m` names the program's module and the client's version.
    listed = run(["go", "list", "-deps", "-f", "{{with .Module}}{{.Path}} {{.Version}}{{end}}", "."],
                 tmp_path / "trainer", go_environment(tmp_path)).stdout
    assert "example.com/trainer" in listed and f"{CLIENT_MODULE} v0.1.0" in listed
    result = subprocess.run([str(binary), sidecar.unix_address], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "allreduce [1.5 2.5]"


def test_the_vendor_script_names_an_import_it_cannot_provide(tmp_path):
    require_go()
    source = TRAINER.replace('"os"', '"os"\n\n\t"github.com/google/uuid"').replace(
        "defer cancel()", "defer cancel()\n\t_ = uuid.New()")
    folder = tmp_path / "stray"
    folder.mkdir()
    (folder / "main.go").write_text(source)
    env = go_environment(tmp_path)
    run(["go", "mod", "init", "example.com/stray"], folder, env)
    result = subprocess.run([str(ROOT / "clients/go/vendor-debian.sh"), "."], cwd=folder, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "github.com/google/uuid" in result.stderr
