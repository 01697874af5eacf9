package engine

import (
	"testing"

	"github.com/matryer/is"
)

// TestDrawPacer: candidates keep drawing while they decide most draws; when most are left open, whole rows draw for
// drawOffFor steps, then candidates are tried again.
func TestDrawPacer(t *testing.T) {
	tests := []struct {
		name     string
		decided  func(i int) bool
		draws    int
		wantOn   bool
		wantStep int // steps until on again (0: on now)
	}{
		{"all decided", func(int) bool { return true }, 1000, true, 0},
		{"nine in ten decided", func(i int) bool { return i%10 != 0 }, 1000, true, 0},
		{"all open", func(int) bool { return false }, 1000, false, drawOffFor},
		{"one in four decided", func(i int) bool { return i%4 == 0 }, 1000, false, drawOffFor},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			var p drawPacer
			for i := 0; i < tt.draws && p.on(); i++ {
				p.observe(tt.decided(i))
			}
			is.Equal(p.on(), tt.wantOn)
			steps := 0
			for !p.on() {
				p.step()
				steps++
			}
			is.Equal(steps, tt.wantStep)
		})
	}
}
