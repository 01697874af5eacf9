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
