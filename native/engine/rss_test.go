package engine

import (
	"bufio"
	"os"
	"strings"
	"testing"
)

// rssLine returns the named line of /proc/self/status ("VmRSS", "RssFile", "RssAnon"), or "" where there is none.
func rssLine(name string) string {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), name+":") {
			return strings.Join(strings.Fields(sc.Text())[1:], " ")
		}
	}
	return ""
}

// TestGGUFResidentMemory logs the process's resident memory after loading DFLASH_BENCH_GGUF on the CPU and after one
// decode step (a measurement, see docs/PERFORMANCE.md issue 18; skipped without the variable).
func TestGGUFResidentMemory(t *testing.T) {
	path := os.Getenv("DFLASH_BENCH_GGUF")
	if path == "" {
		t.Skip("DFLASH_BENCH_GGUF not set")
	}
	lib := openCPU(t)
	t.Logf("before load: VmRSS %s, RssAnon %s, RssFile %s", rssLine("VmRSS"), rssLine("RssAnon"), rssLine("RssFile"))
	m, err := lib.LoadGGUF(path, Options{KVPoolTokens: 256, CacheK: CacheF16, CacheV: CacheF16, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	t.Logf("after load:  VmRSS %s, RssAnon %s, RssFile %s", rssLine("VmRSS"), rssLine("RssAnon"), rssLine("RssFile"))
	s, _ := m.NewSeq()
	if _, err := m.Forward(one(s, []int32{1, 2, 3, 4}, LogitsLast)); err != nil {
		t.Fatal(err)
	}
	t.Logf("after a forward: VmRSS %s, RssAnon %s, RssFile %s", rssLine("VmRSS"), rssLine("RssAnon"), rssLine("RssFile"))
}
