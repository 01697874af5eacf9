package main

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/matryer/is"
)

// TestCoreIsCgoFree keeps the server binary free of native code: it must
// never import the engine binding, a plugin's implementation, or any package
// that uses cgo. Native code lives only in backend plugin processes.
func TestCoreIsCgoFree(t *testing.T) {
	is := is.New(t)
	out, err := exec.Command("go", "list", "-deps", "-json=ImportPath,CgoFiles", ".").Output()
	is.NoErr(err) // go list must work
	dec := json.NewDecoder(strings.NewReader(string(out)))
	const module = "github.com/dflash/dflash_server/"
	for dec.More() {
		var p struct {
			ImportPath string
			CgoFiles   []string
		}
		is.NoErr(dec.Decode(&p))
		if len(p.CgoFiles) > 0 && strings.HasPrefix(p.ImportPath, module) {
			t.Errorf("dflash_server depends on cgo package %s", p.ImportPath)
		}
		for _, banned := range []string{module + "native", module + "plugins/"} {
			if strings.HasPrefix(p.ImportPath, banned) {
				t.Errorf("dflash_server must not import %s", p.ImportPath)
			}
		}
	}
}

// TestEveryPackageDocumented fails on a package without a package comment.
func TestEveryPackageDocumented(t *testing.T) {
	out, err := exec.Command("go", "list", "-json=ImportPath,Doc,Name", "../../...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p struct{ ImportPath, Doc, Name string }
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		if p.Doc == "" {
			t.Errorf("package %s has no package comment (add a doc.go)", p.ImportPath)
		}
	}
}

// TestLayering keeps the seams that the package docs promise: the types a
// plugin author implements, the engine runtime and the router do not pull
// in the go-plugin/gRPC transport (sdk/transport has it), and the router
// knows nothing of HTTP (core/api maps its refusal reasons).
func TestLayering(t *testing.T) {
	const module = "github.com/dflash/dflash_server/"
	tests := []struct {
		pkg    string
		banned []string
		direct bool // only the package's own imports, not its dependencies
	}{
		{pkg: "sdk", banned: []string{"google.golang.org/grpc", "github.com/hashicorp/go-plugin"}},
		{pkg: "sdk/engine", banned: []string{"google.golang.org/grpc", "github.com/hashicorp/go-plugin"}},
		{pkg: "core/router", banned: []string{"google.golang.org/grpc", "github.com/hashicorp/go-plugin"}},
		{pkg: "core/router", banned: []string{"net/http"}, direct: true},
	}
	for _, tt := range tests {
		t.Run(tt.pkg+" "+strings.Join(tt.banned, ","), func(t *testing.T) {
			is := is.New(t)
			args := []string{"list", "-deps", module + tt.pkg}
			if tt.direct {
				args = []string{"list", "-f", `{{join .Imports "\n"}}`, module + tt.pkg}
			}
			out, err := exec.Command("go", args...).Output()
			is.NoErr(err) // go list must work
			for _, p := range strings.Fields(string(out)) {
				for _, b := range tt.banned {
					if p == b || strings.HasPrefix(p, b+"/") {
						t.Errorf("%s imports %s", tt.pkg, p)
					}
				}
			}
		})
	}
}
