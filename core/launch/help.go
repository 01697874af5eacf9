package launch

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/alecthomas/kong"

	"github.com/dflash/dflash_server/sdk"
)

const (
	helpWidth     = 100 // wrap column
	helpMaxLeft   = 40  // widest flag column before help moves to its own line
	helpColumnGap = 4
)

// Help is the full --help text: globals, listener and model options, then
// the options of every discovered backend. Removed flags are not shown.
func Help(cat Catalog) string {
	var sb strings.Builder
	sb.WriteString("Usage: dflash_server [options] [MODEL.gguf [model options]] [--model <path> [model options]]...\n\n")
	sb.WriteString(wrap("Serves one or more GGUF models through one HTTP address. Each --model <path> starts a model "+
		"block; the options after it apply to that model until the next --model. The first model path may be "+
		"given without --model. Options not listed under \"Model options\" are declared by the backend that "+
		"serves the model's GGUF architecture.", helpWidth, ""))
	sb.WriteString("\n\n")
	writeSection(&sb, "", []row{{"-h, --help", "Show this help."}})
	writeSection(&sb, "Global options (before the first model):", kongRows(&globalFlags{}))
	writeSection(&sb, "Listener options (before the first model or in the first model block):", kongRows(&listenerFlags{}))
	writeSection(&sb, "Model options (after each model path):", kongRows(&blockFlags{}))

	backends := append([]BackendHelp(nil), cat.Backends()...)
	sort.Slice(backends, func(i, j int) bool { return backends[i].Name < backends[j].Name })
	if len(backends) == 0 {
		sb.WriteString("No backend plugins found; see --plugin-dir.\n")
	}
	for _, b := range backends {
		archs := append([]string(nil), b.Architectures...)
		sort.Strings(archs)
		title := fmt.Sprintf("Backend %s (architectures: %s), model options:", b.Name, strings.Join(archs, ", "))
		rows := make([]row, 0, len(b.Options))
		for _, o := range b.Options {
			rows = append(rows, optionRow(o))
		}
		if len(rows) == 0 {
			rows = append(rows, row{"(none)", ""})
		}
		writeSection(&sb, title, rows)
	}
	return strings.TrimRight(sb.String(), "\n") + "\n"
}

type row struct{ left, help string }

// kongRows lists a grammar's visible flags in declaration order, written
// as kong writes them (--port=8080, --host="127.0.0.1", --log-level=...).
func kongRows(grammar any) []row {
	k, err := newKong(grammar)
	if err != nil {
		return []row{{"(grammar error)", err.Error()}}
	}
	var rows []row
	for _, f := range k.Model.Flags {
		if f.Hidden {
			continue
		}
		rows = append(rows, row{f.String(), kong.DefaultHelpValueFormatter(f.Value)})
	}
	return rows
}

func optionRow(o sdk.OptionSpec) row {
	left := "--" + o.Name
	help := strings.TrimSpace(o.Help)
	switch o.Kind {
	case sdk.OptionBool:
		if b, _ := strconv.ParseBool(o.Default); b {
			help = appendSentence(help, "Default true; turn off with --"+o.Name+"=false.")
		}
	default:
		placeholder := map[sdk.OptionKind]string{sdk.OptionInt: "INT", sdk.OptionFloat: "FLOAT", sdk.OptionEnum: "VALUE"}[o.Kind]
		if placeholder == "" {
			placeholder = "STRING"
		}
		switch {
		case o.Default != "" && o.Kind == sdk.OptionString:
			placeholder = strconv.Quote(o.Default)
		case o.Default != "":
			placeholder = o.Default
		}
		left += "=" + placeholder
		if o.Kind == sdk.OptionEnum && len(o.Enum) > 0 {
			help = appendSentence(help, "One of: "+strings.Join(o.Enum, ", ")+".")
		}
	}
	if o.SharedProcessPolicy {
		help = appendSentence(help, "A shared-process policy: refused when several models load.")
	}
	return row{left, help}
}

func appendSentence(s, add string) string {
	if s == "" {
		return add
	}
	if !strings.HasSuffix(s, ".") {
		s += "."
	}
	return s + " " + add
}

func writeSection(sb *strings.Builder, title string, rows []row) {
	if title != "" {
		sb.WriteString(title + "\n")
	}
	left := 0
	for _, r := range rows {
		if n := len(r.left); n > left && n <= helpMaxLeft {
			left = n
		}
	}
	indent := strings.Repeat(" ", 2+left+helpColumnGap)
	for _, r := range rows {
		if r.help == "" {
			sb.WriteString("  " + r.left + "\n")
			continue
		}
		if len(r.left) > left {
			sb.WriteString("  " + r.left + "\n")
			sb.WriteString(indent + wrap(r.help, helpWidth, indent) + "\n")
			continue
		}
		pad := strings.Repeat(" ", left-len(r.left)+helpColumnGap)
		sb.WriteString("  " + r.left + pad + wrap(r.help, helpWidth, indent) + "\n")
	}
	sb.WriteString("\n")
}

// wrap breaks text into lines of at most width columns, the first line
// starting at column len(indent) and the others prefixed by indent.
func wrap(text string, width int, indent string) string {
	var sb strings.Builder
	col := len(indent)
	for i, w := range strings.Fields(text) {
		if i > 0 {
			if col+1+len(w) > width {
				sb.WriteString("\n" + indent)
				col = len(indent)
			} else {
				sb.WriteByte(' ')
				col++
			}
		}
		sb.WriteString(w)
		col += len(w)
	}
	return sb.String()
}
