package engine

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/matryer/is"
)

// seqBlobHeaderBytes is the size of seq_export's header (native/src/arch/qwen_state.cpp).
const seqBlobHeaderBytes = 144

// decodeSteps feeds toks one at a time to s and returns each step's logits row.
func decodeSteps(t *testing.T, m *Model, s Seq, toks []int32) [][]float32 {
	t.Helper()
	var rows [][]float32
	for _, tok := range toks {
		r, err := m.Forward(one(s, []int32{tok}, LogitsLast))
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, append([]float32(nil), r.Row(0, 0)...))
	}
	return rows
}

func sameBits(a, b [][]float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return false
		}
		for j := range a[i] {
			if math.Float32bits(a[i][j]) != math.Float32bits(b[i][j]) {
				return false
			}
		}
	}
	return true
}

func TestExportImport(t *testing.T) {
	lib := openCPU(t)
	caches := []struct{ k, v CacheType }{{CacheF32, CacheF32}, {CacheF16, CacheQ8_0}}
	for _, c := range []config{tinyQwen3(), tinyQwen35()} {
		for _, ct := range caches {
			t.Run(c.arch+"/"+string(ct.k)+"-"+string(ct.v), func(t *testing.T) {
				is := is.New(t)
				c := c
				if ct.v == CacheQ8_0 {
					c.headDim = 32 // a whole q8_0 block per head
				}
				opt := Options{KVPoolTokens: 256, BlockSize: 16, MaxSeqs: 4, CacheK: ct.k, CacheV: ct.v, Threads: 2}
				spec := randomSpec(t, c)
				spec.Options = opt
				m1, err := lib.LoadModel(spec)
				is.NoErr(err)
				defer m1.Close()
				m2, err := lib.LoadModel(spec) // a second model of the same spec
				is.NoErr(err)
				defer m2.Close()

				rng := rand.New(rand.NewPCG(19, 3))
				prompt, steps := randomTokens(rng, 37, c.vocab), randomTokens(rng, 4, c.vocab)

				// src's blocks are not consecutive in the pool: a filler takes the block after its first
				src, _ := m1.NewSeq()
				is.NoErr(m1.Reserve(src, 16))
				filler, _ := m1.NewSeq()
				is.NoErr(m1.Reserve(filler, 16))
				_, err = m1.Forward(one(src, prompt, LogitsNone))
				is.NoErr(err)

				blob, err := m1.Export(src)
				is.NoErr(err)
				info := m1.Info()
				is.Equal(uint64(len(blob)), seqBlobHeaderBytes+uint64(len(prompt))*info.KVBytesPerToken+info.StateBytesPerSeq)
				again, err := m1.Export(src)
				is.NoErr(err)
				is.True(bytes.Equal(blob, again)) // export does not change the sequence
				want := decodeSteps(t, m1, src, steps)

				// the same model, after Reserve
				dst, _ := m1.NewSeq()
				is.NoErr(m1.Reserve(dst, len(prompt)+len(steps)))
				is.NoErr(m1.Import(dst, blob))
				n, _ := m1.SeqLen(dst)
				is.Equal(n, len(prompt))
				is.True(sameBits(decodeSteps(t, m1, dst, steps), want))

				// a second model of the same spec, without Reserve: import takes free blocks
				dst2, _ := m2.NewSeq()
				is.NoErr(m2.Import(dst2, blob))
				re, err := m2.Export(dst2)
				is.NoErr(err)
				is.True(bytes.Equal(re, blob)) // the round trip is exact
				is.True(sameBits(decodeSteps(t, m2, dst2, steps), want))

				// refusals change nothing
				fresh, _ := m2.NewSeq()
				stats, _ := m2.KVStats()
				refuse := func(b []byte, target error, msg string) {
					t.Helper()
					err := m2.Import(fresh, b)
					if !errors.Is(err, target) || !strings.Contains(err.Error(), msg) {
						t.Fatalf("import: got %v, want %v containing %q", err, target, msg)
					}
					n, _ := m2.SeqLen(fresh)
					is.Equal(n, 0)
					now, _ := m2.KVStats()
					is.Equal(now, stats)
				}
				trunc := blob[:len(blob)-1]
				refuse(trunc, ErrInvalid, "blob truncated")
				refuse(blob[:100], ErrInvalid, "blob truncated")
				refuse(nil, ErrInvalid, "blob truncated")
				for _, at := range []int{0, 9, 40, 100, 130} {
					bad := bytes.Clone(blob)
					bad[at] ^= 0x10
					refuse(bad, ErrInvalid, map[bool]string{true: "bad magic", false: "corrupt blob header"}[at < 8])
				}
				bad := bytes.Clone(blob)
				bad[seqBlobHeaderBytes+5] ^= 1
				refuse(bad, ErrInvalid, "payload checksum")
				refuse(append(bytes.Clone(blob), 0), ErrInvalid, "blob too long")

				// another architecture, another cache type
				oc := tinyQwen35()
				if c.arch == "qwen35" {
					oc = tinyQwen3()
				}
				oc.headDim = c.headDim
				other := loadRandom(t, lib, oc, opt)
				os, _ := other.NewSeq()
				_, err = other.Forward(one(os, prompt[:20], LogitsNone))
				is.NoErr(err)
				ob, err := other.Export(os)
				is.NoErr(err)
				refuse(ob, ErrInvalid, "blob does not fit this model: arch "+oc.arch+" (model "+c.arch+")")
				ot := opt
				ot.CacheK, ot.CacheV = CacheBF16, ct.v
				otherType := loadRandom(t, lib, c, ot)
				ts, _ := otherType.NewSeq()
				_, err = otherType.Forward(one(ts, prompt[:20], LogitsNone))
				is.NoErr(err)
				tb, err := otherType.Export(ts)
				is.NoErr(err)
				refuse(tb, ErrInvalid, "cache type k bf16 (model "+string(ct.k)+")")

				// a non-empty sequence
				err = m2.Import(dst2, blob)
				is.True(errors.Is(err, ErrState))
				is.True(strings.Contains(err.Error(), "not empty"))
				n, _ = m2.SeqLen(dst2)
				is.Equal(n, len(prompt)+len(steps))

				// a pool too short: ErrNoKV, nothing taken
				hog, _ := m2.NewSeq()
				is.NoErr(m2.Reserve(hog, stats.BlocksFree*stats.BlockSize-16))
				stats, _ = m2.KVStats()
				refuse(blob, ErrNoKV, "KV pool exhausted")
				is.NoErr(m2.FreeSeq(hog))
				is.NoErr(m2.Import(fresh, blob))
				is.True(sameBits(decodeSteps(t, m2, fresh, steps), want))
			})
		}
	}
}

// A DFlash draft has no exportable state.
func TestExportDraftUnsupported(t *testing.T) {
	lib := openCPU(t)
	d, _ := loadDraft(t, lib, tinyDraft())
	s, err := d.NewSeq()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Export(s); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("export of a draft: %v", err)
	}
	if err := d.Import(s, make([]byte, 200)); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("import into a draft: %v", err)
	}
}

// TestDeviceExportImport (DFLASH_TEST_DEVICE=cuda:0): the round trip on the device is exact, and the blob format is
// the same on every device: a blob exported on the GPU continues on the CPU and one from the CPU on the GPU, logits
// within deviceBound of the exporting side's own continuation.
func TestDeviceExportImport(t *testing.T) {
	dev := testDevice(t)
	cpu := openCPU(t)
	caches := []struct{ k, v CacheType }{{CacheF32, CacheF32}, {CacheF16, CacheQ8_0}}
	for _, c := range []config{tinyQwen3(), tinyQwen35()} {
		for _, ct := range caches {
			t.Run(c.arch+"/"+string(ct.k)+"-"+string(ct.v), func(t *testing.T) {
				is := is.New(t)
				c := c
				if ct.v == CacheQ8_0 {
					c.headDim = 32
				}
				spec := randomSpec(t, c)
				spec.Options = Options{KVPoolTokens: 256, BlockSize: 16, MaxSeqs: 4, CacheK: ct.k, CacheV: ct.v, Threads: 2}
				md, err := dev.LoadModel(spec)
				is.NoErr(err)
				defer md.Close()
				mc, err := cpu.LoadModel(spec)
				is.NoErr(err)
				defer mc.Close()
				rng := rand.New(rand.NewPCG(23, 5))
				prompt, steps := randomTokens(rng, 45, c.vocab), randomTokens(rng, 4, c.vocab)

				export := func(m *Model) ([]byte, [][]float32) {
					s, _ := m.NewSeq()
					filler, _ := m.NewSeq()
					is.NoErr(m.Reserve(s, 16))
					is.NoErr(m.Reserve(filler, 16)) // s's blocks are not consecutive
					_, err := m.Forward(one(s, prompt, LogitsNone))
					is.NoErr(err)
					blob, err := m.Export(s)
					is.NoErr(err)
					want := decodeSteps(t, m, s, steps)
					is.NoErr(m.FreeSeq(s))
					is.NoErr(m.FreeSeq(filler))
					return blob, want
				}
				importAndDecode := func(m *Model, blob []byte) [][]float32 {
					s, _ := m.NewSeq()
					is.NoErr(m.Import(s, blob))
					re, err := m.Export(s)
					is.NoErr(err)
					is.True(bytes.Equal(re, blob))
					got := decodeSteps(t, m, s, steps)
					is.NoErr(m.FreeSeq(s))
					return got
				}
				near := func(what string, got, want [][]float32, bound float64) {
					t.Helper()
					for i := range want {
						if e := relErr(got[i], want[i]); e > bound {
							t.Errorf("%s step %d: rel err %.3g > %.3g", what, i, e, bound)
						}
					}
				}
				bd, wd := export(md)
				bc, wc := export(mc)
				is.Equal(len(bd), len(bc))
				near("device -> device", importAndDecode(md, bd), wd, 1e-5)
				near("device -> cpu", importAndDecode(mc, bd), wd, deviceBound)
				near("cpu -> device", importAndDecode(md, bc), wc, deviceBound)
			})
		}
	}
}
