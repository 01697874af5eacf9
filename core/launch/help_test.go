package launch

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/matryer/is"
)

var update = flag.Bool("update", false, "rewrite testdata/help.golden")

func TestHelpGolden(t *testing.T) {
	is := is.New(t)
	got := Help(newFakeCatalog())
	golden := filepath.Join("testdata", "help.golden")
	if *update {
		is.NoErr(os.MkdirAll("testdata", 0o755))
		is.NoErr(os.WriteFile(golden, []byte(got), 0o644))
	}
	want, err := os.ReadFile(golden)
	is.NoErr(err)               // run go test ./core/launch -run HelpGolden -update to create it
	is.Equal(got, string(want)) // help text changed; rerun with -update and review the diff
}

func TestHelpContents(t *testing.T) {
	help := Help(newFakeCatalog())
	core, err := loadCoreFlags()
	if err != nil {
		t.Fatal(err)
	}
	for name, def := range core {
		t.Run(name, func(t *testing.T) {
			is := is.New(t)
			shown := regexp.MustCompile(`(?m)^\s+--` + regexp.QuoteMeta(name) + `\b[^-]`).MatchString(help)
			is.Equal(shown, def.scope != scopeRemoved) // removed flags hidden, every other flag listed
		})
	}
	for _, b := range newFakeCatalog().Backends() {
		t.Run(b.Name, func(t *testing.T) {
			is := is.New(t)
			is.True(strings.Contains(help, "Backend "+b.Name+" (architectures: ")) // a section per backend
			for _, o := range b.Options {
				is.True(strings.Contains(help, "  --"+o.Name)) // backend option listed
			}
		})
	}
	t.Run("no backends", func(t *testing.T) {
		is := is.New(t)
		is.True(strings.Contains(Help(&fakeCatalog{}), "No backend plugins found; see --plugin-dir."))
	})
	t.Run("lines fit", func(t *testing.T) {
		is := is.New(t)
		for _, line := range strings.Split(help, "\n") {
			is.True(len(line) <= helpWidth) // wrapped at helpWidth
		}
	})
}

func TestPluginDirArg(t *testing.T) {
	tests := []struct {
		args   string
		want   string
		wantOK bool
	}{
		{"--plugin-dir /p --model /m/a.gguf", "/p", true},
		{"--plugin-dir=/q /m/a.gguf", "/q", true},
		{"--port 1 --model /m/a.gguf --plugin-dir /late", "", false},
		{"--plugin-dir", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			is := is.New(t)
			got, ok := PluginDirArg(args(tt.args))
			is.Equal(got, tt.want)
			is.Equal(ok, tt.wantOK)
		})
	}
}
