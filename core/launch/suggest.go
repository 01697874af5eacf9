package launch

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/dflash/dflash_server/sdk"
)

func (p *parser) misplacedInHead(occ occurrence) string {
	if occ.def == nil {
		if len(p.owners(occ.name, "")) > 0 {
			return fmt.Sprintf("%s is a model option; put it after --model <path>", occ.display)
		}
		return p.unknown(occ, nil)
	}
	switch occ.def.scope {
	case scopeRemoved:
		return removedMsg(occ)
	case scopeBlock:
		return fmt.Sprintf("%s is a model option; put it after --model <path>", occ.display)
	}
	return ""
}

func removedMsg(occ occurrence) string {
	return fmt.Sprintf("%s was removed; %s", occ.display, occ.def.removed)
}

// owners lists the backends (other than except) that declare option name.
func (p *parser) owners(name, except string) []string {
	var out []string
	for _, b := range p.backendList() {
		if b.Name == except {
			continue
		}
		for _, o := range b.Options {
			if o.Name == name {
				out = append(out, b.Name)
				break
			}
		}
	}
	return out
}

// unknown is kong's "unknown flag" message with suggestions from every
// flag the launch knows, removed ones included, so that a near miss of a
// flag from another place leads to the message about where it belongs.
func (p *parser) unknown(occ occurrence, extra []sdk.OptionSpec) string {
	msg := "unknown flag " + occ.display
	seen := map[string]bool{}
	type cand struct {
		name string
		dist int
	}
	var cands []cand
	add := func(name string) {
		if seen[name] {
			return
		}
		seen[name] = true
		d := levenshtein(occ.name, name)
		if d <= 2 || (len(occ.name) >= 3 && strings.HasPrefix(name, occ.name)) {
			cands = append(cands, cand{name, d})
		}
	}
	for name := range p.core {
		add(name)
	}
	for _, b := range p.backendList() {
		for _, o := range b.Options {
			add(o.Name)
		}
	}
	for _, o := range extra {
		add(o.Name)
	}
	if len(cands) == 0 {
		return msg
	}
	sort.Slice(cands, func(i, j int) bool {
		if cands[i].dist != cands[j].dist {
			return cands[i].dist < cands[j].dist
		}
		return cands[i].name < cands[j].name
	})
	if len(cands) > 4 {
		cands = cands[:4]
	}
	if len(cands) == 1 {
		return fmt.Sprintf("%s, did you mean %q?", msg, "--"+cands[0].name)
	}
	quoted := make([]string, len(cands))
	for i, c := range cands {
		quoted[i] = strconv.Quote("--" + c.name)
	}
	return fmt.Sprintf("%s, did you mean one of %s?", msg, strings.Join(quoted, ", "))
}

// levenshtein is the edit distance between a and b, by runes.
func levenshtein(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}
