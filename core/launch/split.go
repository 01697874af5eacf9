package launch

import (
	"fmt"
	"strings"
)

// rawBlock is a block's tokens as split from argv.
type rawBlock struct {
	index int
	path  string
	arch  string   // general.architecture of path, read before parsing
	args  []string // from --model (or the positional path) on
	opts  []string // after the path
}

// splitBlocks cuts argv at every --model <path> / --model=<path>. A literal
// --model is always a boundary, even where a flag value was expected.
func splitBlocks(args []string) (head []string, blocks []*rawBlock, err error) {
	var cur *rawBlock
	for i := 0; i < len(args); i++ {
		tok := args[i]
		var path string
		var start []string
		switch {
		case tok == "--model":
			if i+1 >= len(args) || strings.HasPrefix(args[i+1], "-") {
				return nil, nil, usagef("--model needs a path: --model <path> [model options]")
			}
			path, start = args[i+1], args[i:i+2]
			i++
		case strings.HasPrefix(tok, "--model="):
			path, start = strings.TrimPrefix(tok, "--model="), args[i:i+1]
			if path == "" {
				return nil, nil, usagef("--model needs a path: --model <path> [model options]")
			}
		default:
			if cur == nil {
				head = append(head, tok)
			} else {
				cur.args = append(cur.args, tok)
				cur.opts = append(cur.opts, tok)
			}
			continue
		}
		cur = &rawBlock{path: path, args: append([]string(nil), start...)}
		blocks = append(blocks, cur)
	}
	return head, blocks, nil
}

// occurrence is one flag as written.
type occurrence struct {
	def     *flagDef // nil when unknown
	display string   // the flag as written, without any =value: "--max-ctx", "-x"
	name    string   // without dashes
	value   string
	inline  bool // the value came with =
	missing bool // a value was needed and none followed
}

// isFlag says whether tok is written as a flag rather than a value.
func isFlag(tok string) bool { return len(tok) > 1 && tok[0] == '-' }

// readFlag reads the flag at toks[i] and, when it takes one, its value;
// it returns the index of the next unread token.
func readFlag(toks []string, i int, lookup func(string) *flagDef) (occurrence, int) {
	tok := toks[i]
	var occ occurrence
	body := strings.TrimPrefix(tok, "-")
	long := strings.HasPrefix(body, "-")
	body = strings.TrimPrefix(body, "-")
	occ.name, occ.value, occ.inline = strings.Cut(body, "=")
	occ.display, _, _ = strings.Cut(tok, "=")
	if long {
		occ.def = lookup(occ.name)
	}
	next := i + 1
	if occ.def == nil || occ.def.isBool || occ.inline {
		return occ, next
	}
	if next < len(toks) && !strings.HasPrefix(toks[next], "--") {
		occ.value = toks[next]
		return occ, next + 1
	}
	occ.missing = true
	return occ, next
}

// kongToken writes occ for a kong grammar, always as one token so that
// values starting with "-" are never taken for flags.
func kongToken(occ occurrence) string {
	if occ.def.isBool && !occ.inline {
		return "--" + occ.name
	}
	return "--" + occ.name + "=" + occ.value
}

func flagName(kongTok string) string {
	name, _, _ := strings.Cut(strings.TrimPrefix(kongTok, "--"), "=")
	return name
}

func (p *parser) lookupCore(name string) *flagDef { return p.core[name] }

// walkHead checks what precedes the first block: global and listener
// options, and possibly the first model path written without --model.
func (p *parser) walkHead(head []string) (toks []string, given map[string]bool, positional *rawBlock, err error) {
	given = map[string]bool{}
	for i := 0; i < len(head); {
		tok := head[i]
		if tok == "--" {
			return nil, nil, nil, usagef(`"--" is not supported`)
		}
		if !isFlag(tok) {
			positional = &rawBlock{path: tok, args: append([]string(nil), head[i:]...), opts: head[i+1:]}
			return toks, given, positional, nil
		}
		occ, next := readFlag(head, i, p.lookupCore)
		if msg := p.misplacedInHead(occ); msg != "" {
			return nil, nil, nil, usagef("%s", msg)
		}
		if occ.missing {
			return nil, nil, nil, usagef("%s: missing value", occ.display)
		}
		toks = append(toks, kongToken(occ))
		given[occ.name] = true
		i = next
	}
	return toks, given, nil, nil
}

// parseKong decodes already partitioned tokens into grammar with a fresh
// parser (no state leaks between blocks).
func parseKong(grammar any, toks []string) error {
	k, err := newKong(grammar)
	if err != nil {
		return fmt.Errorf("launch: grammar: %w", err)
	}
	_, err = k.Parse(toks)
	return err
}
