package chat

import (
	"testing"
)

// FuzzParser feeds arbitrary output to every family's parser, whole and in
// chunks chosen by cuts: it must not panic, chunking must not change the
// pieces, and every tool call's arguments must be one JSON object.
func FuzzParser(f *testing.F) {
	for _, tc := range parserCases {
		f.Add(tc.in, uint64(0x9e3779b97f4a7c15))
	}
	f.Add("<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, {\"y\": \"\\u00e9\"}]}}</tool_call>", uint64(7))
	f.Add("<tool_call><function=a><parameter=b>\n1\n</parameter></function></tool_call>", uint64(3))
	f.Fuzz(func(t *testing.T, in string, cuts uint64) {
		for _, fam := range []Family{FamilyUnknown, FamilyQwen3, FamilyQwen35, FamilyDeepSeekV4} {
			for _, open := range []bool{false, true} {
				opts := ParserOptions{ThinkingOpen: open, Tools: true, ToolSchemas: testSchemas}
				whole := parseChunks(fam, opts, in)
				checkArgsValid(t, whole)
				next := 0
				for _, p := range whole {
					if p.Kind == PieceToolCallStart {
						if p.Index != next {
							t.Fatalf("%s: call index %d, want %d", fam, p.Index, next)
						}
						next++
					}
				}
				var chunks []string
				rest, c := in, cuts
				for len(rest) > 0 {
					n := int(c%7) + 1
					c = c/7 + 0x9e37
					n = min(n, len(rest))
					chunks, rest = append(chunks, rest[:n]), rest[n:]
				}
				if got := parseChunks(fam, opts, chunks...); !equalPieces(got, whole) {
					t.Fatalf("%s open=%v: chunks %q\n got %v\nwant %v", fam, open, chunks, got, whole)
				}
			}
		}
	})
}
