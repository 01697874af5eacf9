package jinja

import "testing"

// FuzzTemplate compiles and renders arbitrary template text: errors are
// fine, panics are not.
func FuzzTemplate(f *testing.F) {
	for _, s := range []string{
		"{% for x in l[::-1] %}{{ loop.index }}{{ x|tojson }}{% endfor %}",
		"{%- set ns = namespace(a=1) -%}{% set ns.a = ns.a * 2 %}{{ ns.a }}",
		"{% macro m(a, b=2) %}{{ a ~ b }}{% endmacro %}{{ m(1)|trim }}",
		"{{ d.get('a', 1) if d is mapping else 'x' }}{{ s.split(',')[0].strip() }}",
		"  {% if n is none %}\n  x\n{%- endif %}{# c #}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		tmpl, err := Compile(src)
		if err != nil {
			return
		}
		_, _ = tmpl.Render(pythonVars())
	})
}
