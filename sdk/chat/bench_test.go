package chat

import (
	"strings"
	"testing"
)

// BenchmarkRender renders each golden template's longest conversation.
func BenchmarkRender(b *testing.B) {
	for _, g := range loadGoldens(b) {
		src := loadTemplateSource(b, g.Source)
		tmpl, err := NewTemplate(src)
		if err != nil {
			b.Fatal(err)
		}
		var c goldenCase
		for _, gc := range g.Cases {
			if gc.Expected != nil && (c.Expected == nil || len(*gc.Expected) > len(*c.Expected)) {
				c = gc
			}
		}
		opts := RenderOptions{Tools: c.Tools, AddGenerationPrompt: c.AddGenerationPrompt,
			EnableThinking: c.EnableThinking, Extra: c.Extra, BOSToken: g.BOSToken, EOSToken: g.EOSToken}
		b.Run(g.Template, func(b *testing.B) {
			b.SetBytes(int64(len(*c.Expected)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tmpl.Render(c.Messages, opts); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkParse feeds a long generation in 4-byte pieces (about one token
// each): reasoning, an answer and a tool call.
func BenchmarkParse(b *testing.B) {
	thought := strings.Repeat("The user wants the weather, so I will call the tool. ", 40)
	answer := strings.Repeat("Here is a sentence of the answer with <b>markup</b> in it. ", 40)
	outputs := map[Family]string{
		FamilyQwen3: "<think>\n" + thought + "\n</think>\n\n" + answer +
			"\n\n<tool_call>\n{\"name\": \"search_web\", \"arguments\": {\"query\": \"" + strings.Repeat("weather oslo ", 20) + "\", \"tags\": [\"a\", \"b\"]}}\n</tool_call>",
		FamilyQwen35: thought + "\n</think>\n\n" + answer +
			"\n\n<tool_call>\n<function=search_web>\n<parameter=query>\n" + strings.Repeat("weather oslo ", 20) + "\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n</function>\n</tool_call>",
		FamilyDeepSeekV4: thought + "</think>" + answer +
			"\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"search_web\">\n<｜DSML｜parameter name=\"query\" string=\"true\">" + strings.Repeat("weather oslo ", 20) + "</｜DSML｜parameter>\n<｜DSML｜parameter name=\"tags\" string=\"false\">[\"a\", \"b\"]</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
	}
	for _, fam := range []Family{FamilyQwen3, FamilyQwen35, FamilyDeepSeekV4} {
		out := outputs[fam]
		var chunks []string
		for i := 0; i < len(out); i += 4 {
			chunks = append(chunks, out[i:min(i+4, len(out))])
		}
		opts := ParserOptions{ThinkingOpen: fam != FamilyQwen3, Tools: true, ToolSchemas: testSchemas, NewID: seqIDs}
		b.Run(fam.String(), func(b *testing.B) {
			b.SetBytes(int64(len(out)))
			b.ReportAllocs()
			for b.Loop() {
				p := NewParser(fam, opts)
				for _, c := range chunks {
					p.Feed(c)
				}
				p.Close()
			}
		})
	}
}
