package quant

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/dflash/dflash_server/sdk/gguf"
	"github.com/matryer/is"
)

func TestHalfSpecValues(t *testing.T) {
	is := is.New(t)
	for _, tc := range []struct {
		h uint16
		f float32
	}{{0x3C00, 1}, {0xC000, -2}, {0x7BFF, 65504}, {0x0001, 5.960464478e-08}, {0x0400, 6.103515625e-05}, {0x8000, float32(math.Copysign(0, -1))}} {
		is.Equal(F16ToF32(tc.h), tc.f)
		is.Equal(F32ToF16(tc.f), tc.h)
	}
	is.True(math.IsInf(float64(F16ToF32(0x7C00)), 1))
	is.True(math.IsNaN(float64(F16ToF32(0x7E00))))
	is.Equal(F32ToF16(65520), uint16(0x7C00))    // rounds up to infinity
	is.Equal(F32ToF16(65519.99), uint16(0x7BFF)) // just below the midpoint
	is.Equal(F32ToF16(1e10), uint16(0x7C00))
	is.Equal(F32ToF16(-1e-10), uint16(0x8000))
	is.Equal(F32ToF16(float32(math.NaN()))&0x7C00, uint16(0x7C00))
	is.True(F32ToF16(float32(math.NaN()))&0x3FF != 0)

	is.Equal(BF16ToF32(0x3F80), float32(1))
	is.Equal(BF16ToF32(0xC049), float32(-3.140625))
	is.True(math.IsInf(float64(BF16ToF32(0x7F80)), 1))
	is.Equal(F32ToBF16(1), uint16(0x3F80))
	is.Equal(F32ToBF16(-3.140625), uint16(0xC049))
	is.Equal(F32ToBF16(math.Float32frombits(0x3F808000)), uint16(0x3F80)) // tie to even
	is.Equal(F32ToBF16(math.Float32frombits(0x3F818000)), uint16(0x3F82)) // tie to even, up
	is.Equal(F32ToBF16(math.Float32frombits(0x7F800001)), uint16(0x7FC0)) // NaN forced quiet
}

// TestHalfRounding checks every finite f16 round-trips, and that midpoints
// between neighbours round to the even one while values just off a
// midpoint round to the nearer neighbour.
func TestHalfRounding(t *testing.T) {
	for h := 0; h < 0x7C00; h++ {
		for _, sign := range []uint16{0, 0x8000} {
			a := uint16(h) | sign
			fa := F16ToF32(a)
			if got := F32ToF16(fa); got != a && !(h == 0) {
				t.Fatalf("round trip %#04x -> %g -> %#04x", a, fa, got)
			}
			if h == 0x7BFF {
				continue
			}
			b := a + 1
			fb := F16ToF32(b)
			mid := (fa + fb) / 2 // exact: neighbours differ in one f16 ulp
			want := a
			if a&1 == 1 {
				want = b
			}
			if got := F32ToF16(mid); got != want {
				t.Fatalf("midpoint of %#04x and %#04x (%g) -> %#04x, want %#04x", a, b, mid, got, want)
			}
			if got := F32ToF16(math.Nextafter32(mid, fb)); got != b {
				t.Fatalf("above midpoint of %#04x,%#04x -> %#04x", a, b, got)
			}
			if got := F32ToF16(math.Nextafter32(mid, fa)); got != a {
				t.Fatalf("below midpoint of %#04x,%#04x -> %#04x", a, b, got)
			}
		}
	}
}

// specBlock builds the spec's §3.11 test block: b[k] = (29k+7) mod 256 with
// fp16 fields overwritten.
func specBlock(t gguf.Type) []byte {
	b := make([]byte, t.TypeSize())
	for k := range b {
		b[k] = byte((29*k + 7) % 256)
	}
	le := binary.LittleEndian
	switch t {
	case gguf.Q4_0, gguf.Q8_0:
		le.PutUint16(b, 0x3800)
	case gguf.Q4_K, gguf.Q5_K:
		le.PutUint16(b, 0x3800)
		le.PutUint16(b[2:], 0x3400)
	case gguf.Q6_K:
		le.PutUint16(b[208:], 0x3800)
	case gguf.Q2_K:
		le.PutUint16(b[80:], 0x3800)
		le.PutUint16(b[82:], 0x3400)
	case gguf.Q3_K:
		le.PutUint16(b[108:], 0x3800)
	}
	return b
}

func TestDequantizeSpecVectors(t *testing.T) {
	tests := []struct {
		typ   gguf.Type
		first []float32
		sel   map[int]float32
		sum   float32
		wsum  float32
	}{
		{gguf.Q4_0, []float32{-3.5, 3, 1.5, 0, -1.5, -3, 3.5, 2}, map[int]float32{15: -2, 16: -2, 31: 3.5}, -2.5, 42},
		{gguf.Q8_0, []float32{32.5, 47, 61.5, -52, -37.5, -23, -8.5, 6}, map[int]float32{15: -6, 16: 8.5, 31: -30}, -88, -3176},
		{gguf.Q4_K, []float32{194.75, 106.25, 17.75, 401.25, 312.75, 224.25, 135.75, 47.25},
			map[int]float32{32: 153, 63: 57, 64: 175.25, 127: 133.5, 128: 53, 200: 335.25, 255: 80.25}, 35348, 4626732},
		{gguf.Q5_K, []float32{666.75, 106.25, 489.75, 401.25, 784.75, 224.25, 607.75, 47.25},
			map[int]float32{32: 273, 63: 369, 64: 599.25, 127: 223.5, 128: 205, 200: 335.25, 255: 370.25}, 75188, 9820932},
		{gguf.Q6_K, []float32{-655.5, 798, 427.5, -399, -769.5, 684, 313.5, -57},
			map[int]float32{32: -4.5, 63: 150, 64: -944, 127: 1650, 128: -931.5, 200: -525, 255: 366}, -742, -147362},
		// Q2_K and Q3_K are not in the spec; these values come from ggml's
		// dequantize_row_q2_K / _q3_K (ggml @ d99724f2) on blocks built the
		// same way (d = 0.5 at offset 80 / 108, dmin = 0.25 at 82).
		{gguf.Q2_K, []float32{10.5, 0, 3.5, 7, 10.5, 0, 3.5, 7},
			map[int]float32{16: 5.5, 17: -0.5, 32: -0.5, 63: 12.75, 64: 3.75, 127: -2.25, 128: 19, 200: 0, 255: 12.25}, 1056, 136634},
		{gguf.Q3_K, []float32{34.5, -46, 11.5, -23, 34.5, -46, 11.5, -23},
			map[int]float32{16: -42, 17: 56, 32: -7.5, 63: 14, 64: 27, 127: 0, 128: 9, 200: 21, 255: -31.5}, 84, 22216},
	}
	for _, tc := range tests {
		t.Run(tc.typ.String(), func(t *testing.T) {
			is := is.New(t)
			y, err := ToFloat32(tc.typ, specBlock(tc.typ))
			is.NoErr(err)
			is.Equal(len(y), tc.typ.BlockSize())
			is.Equal(y[:8], tc.first)
			for i, v := range tc.sel {
				is.Equal(y[i], v)
			}
			var sum, wsum float64
			for e, v := range y {
				sum += float64(v)
				wsum += float64(v) * float64(e+1)
			}
			is.Equal(sum, float64(tc.sum))
			is.Equal(wsum, float64(tc.wsum))
		})
	}
}

func TestDequantizeLegacyFormulas(t *testing.T) {
	is := is.New(t)
	// Q4_1: d = 0.5, m = -1, nibble codes j and 15-j.
	b := make([]byte, 20)
	binary.LittleEndian.PutUint16(b, 0x3800)
	binary.LittleEndian.PutUint16(b[2:], 0xBC00)
	for j := 0; j < 16; j++ {
		b[4+j] = byte(j) | byte(15-j)<<4
	}
	y, err := ToFloat32(gguf.Q4_1, b)
	is.NoErr(err)
	is.Equal(y[3], float32(0.5)) // 0.5·3 − 1
	is.Equal(y[19], float32(5))  // 0.5·12 − 1
	// Q5_0: d = 1, qh bit 0 and bit 16 set, codes 0.
	b = make([]byte, 22)
	binary.LittleEndian.PutUint16(b, 0x3C00)
	binary.LittleEndian.PutUint32(b[2:], 1|1<<16)
	y, err = ToFloat32(gguf.Q5_0, b)
	is.NoErr(err)
	is.Equal(y[0], float32(0))   // (0|16) − 16
	is.Equal(y[16], float32(0))  // high half, bit 16
	is.Equal(y[1], float32(-16)) // no high bit
	// MXFP4: e = 128 → scale 1, code 7 → 12 (6.0 doubled).
	b = make([]byte, 17)
	b[0], b[1] = 128, 0x97
	y, err = ToFloat32(gguf.MXFP4, b)
	is.NoErr(err)
	is.Equal(y[0], float32(12))
	is.Equal(y[16], float32(-1))
}

func TestDequantizeErrors(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"unsupported", Dequantize(gguf.IQ2_XXS, make([]byte, 66), make([]float32, 256)), "dequantizing IQ2_XXS is not supported"},
		{"partial block", Dequantize(gguf.Q8_0, make([]byte, 34), make([]float32, 31)), "31 elements is not a multiple of the block size 32"},
		{"short source", Dequantize(gguf.Q4_K, make([]byte, 100), make([]float32, 256)), "need 144 bytes, have 100"},
		{"unsupported quantize", Quantize(gguf.Q5_K, make([]float32, 256), make([]byte, 176)), "quantizing to Q5_K is not supported"},
		{"partial quantize block", Quantize(gguf.Q8_0, make([]float32, 31), make([]byte, 34)), "quantize Q8_0: 31 elements is not a multiple of the block size 32"},
		{"short destination", Quantize(gguf.Q8_0, make([]float32, 64), make([]byte, 34)), "need 68 bytes, have 34"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			is.True(tc.err != nil)
			is.True(strings.Contains(tc.err.Error(), tc.want))
		})
	}
}

func rmsRel(x, y []float32) float64 {
	var num, den float64
	for i := range x {
		d := float64(x[i] - y[i])
		num += d * d
		den += float64(x[i]) * float64(x[i])
	}
	return math.Sqrt(num / den)
}

func TestQuantizeRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, 4096)
	for i := range x {
		x[i] = float32(r.NormFloat64()) * 0.05
	}
	x[5] = 0.9 // an outlier in one block
	tests := []struct {
		typ    gguf.Type
		maxRel float64
	}{
		{gguf.F32, 0}, {gguf.F16, 1e-3}, {gguf.BF16, 4e-3},
		{gguf.Q8_0, 0.01}, {gguf.Q6_K, 0.03}, {gguf.Q4_K, 0.1}, {gguf.Q4_0, 0.15},
	}
	for _, tc := range tests {
		t.Run(tc.typ.String(), func(t *testing.T) {
			is := is.New(t)
			is.True(CanQuantize(tc.typ) && CanDequantize(tc.typ))
			q, err := FromFloat32(tc.typ, x)
			is.NoErr(err)
			is.Equal(uint64(len(q)), tc.typ.RowSize(uint64(len(x))))
			y, err := ToFloat32(tc.typ, q)
			is.NoErr(err)
			rel := rmsRel(x, y)
			t.Logf("%s relative RMS error %.5f", tc.typ, rel)
			is.True(rel <= tc.maxRel)
		})
	}
}

// TestQuantizeExact checks values a format can hold survive unchanged, and
// that all-zero blocks stay zero (no NaN from a zero scale).
func TestQuantizeExact(t *testing.T) {
	for _, typ := range []gguf.Type{gguf.Q8_0, gguf.Q4_0, gguf.Q4_K, gguf.Q6_K} {
		t.Run(typ.String(), func(t *testing.T) {
			is := is.New(t)
			zero := make([]float32, typ.BlockSize())
			q, err := FromFloat32(typ, zero)
			is.NoErr(err)
			y, err := ToFloat32(typ, q)
			is.NoErr(err)
			is.Equal(y, zero)
		})
	}
	// Integers with the block maximum at the format's scale are exact.
	for _, tc := range []struct {
		typ gguf.Type
		x   func(i int) float32
	}{
		{gguf.Q8_0, func(i int) float32 { return float32(i*8 - 127) }}, // d = 127/127
		{gguf.Q4_0, func(i int) float32 { return float32(i%16 - 8) }},  // d = -8/-8
	} {
		t.Run(tc.typ.String()+" exact", func(t *testing.T) {
			is := is.New(t)
			x := make([]float32, 32)
			for i := range x {
				x[i] = tc.x(i)
			}
			q, err := FromFloat32(tc.typ, x)
			is.NoErr(err)
			y, err := ToFloat32(tc.typ, q)
			is.NoErr(err)
			is.Equal(y, x)
		})
	}
}

func BenchmarkQuantizeQ4_K(b *testing.B) {
	x := make([]float32, 4096)
	for i := range x {
		x[i] = float32(math.Sin(float64(i)))
	}
	out := make([]byte, gguf.Q4_K.RowSize(4096))
	b.SetBytes(4096 * 4)
	for b.Loop() {
		_ = Quantize(gguf.Q4_K, x, out)
	}
}

func BenchmarkDequantizeQ4_K(b *testing.B) {
	x := make([]float32, 4096)
	for i := range x {
		x[i] = float32(math.Sin(float64(i)))
	}
	q, _ := FromFloat32(gguf.Q4_K, x)
	b.SetBytes(4096 * 4)
	for b.Loop() {
		_ = Dequantize(gguf.Q4_K, q, x)
	}
}

// TestQuantizeMatchesGGML compares our quantizers' bytes with ggml's
// reference quantize_row_*_ref (ggml @ d99724f2, built with gcc, no FMA) on
// two fixed inputs (values exactly reproducible in C and Go), by FNV-1a hash
// of the output.
func TestQuantizeMatchesGGML(t *testing.T) {
	const n = 4096
	inputs := [2][]float32{make([]float32, n), make([]float32, n)}
	for i := 0; i < n; i++ {
		inputs[0][i] = float32((i*37)%1001-500) / 250
		inputs[1][i] = float32((i*i*13)%2003-1001) / float32(100+(i%13)*37)
	}
	inputs[0][7] = 9 // an outlier
	fnv := func(b []byte) uint64 {
		h := uint64(1469598103934665603)
		for _, c := range b {
			h ^= uint64(c)
			h *= 1099511628211
		}
		return h
	}
	for _, tc := range []struct {
		typ    gguf.Type
		hashes [2]uint64
	}{
		{gguf.Q8_0, [2]uint64{0x6411785e14ace6c5, 0x1c7c953378b048c4}},
		{gguf.Q4_0, [2]uint64{0x1790f22c598fc04b, 0x822e741e1e94ef77}},
		{gguf.Q4_K, [2]uint64{0x76bb754c1a6039aa, 0x830309f95e70da23}},
		{gguf.Q6_K, [2]uint64{0xf258e491e32a67f3, 0xdf257e9cd7816e86}},
	} {
		t.Run(tc.typ.String(), func(t *testing.T) {
			for k, x := range inputs {
				q, err := FromFloat32(tc.typ, x)
				if err != nil {
					t.Fatal(err)
				}
				if got := fnv(q); got != tc.hashes[k] {
					t.Errorf("input %d: %s bytes hash %016x, ggml's %016x", k, tc.typ, got, tc.hashes[k])
				}
			}
		})
	}
}

// TestDequantizeMatchesGGML: blocks b[k] = (29k+7) mod 256 with d = 0.5
// (and m/dmin = 0.25 where the type has one) at the usual offsets; sums
// from ggml's dequantize_row_* (ggml @ d99724f2).
func TestDequantizeMatchesGGML(t *testing.T) {
	for _, tc := range []struct {
		typ        gguf.Type
		dpos, mpos int
		sum, wsum  float64
	}{
		{gguf.Q4_1, 0, 2, 130.5, 2132.5},
		{gguf.Q5_0, 0, -1, -8.5, -51},
		{gguf.Q5_1, 0, 2, 268.5, 4283.5},
		{gguf.IQ4_NL, 0, -1, -13, 992},
		{gguf.MXFP4, -1, -1, 3.76158192263132e-36, 7.2222372914521344e-35},
		{gguf.Q8_K, -1, -1, -4.4535220624201823e+20, 1.1890903066580028e+23},
	} {
		t.Run(tc.typ.String(), func(t *testing.T) {
			is := is.New(t)
			b := make([]byte, tc.typ.TypeSize())
			for k := range b {
				b[k] = byte((29*k + 7) % 256)
			}
			if tc.dpos >= 0 {
				binary.LittleEndian.PutUint16(b[tc.dpos:], 0x3800)
			}
			if tc.mpos >= 0 {
				binary.LittleEndian.PutUint16(b[tc.mpos:], 0x3400)
			}
			y, err := ToFloat32(tc.typ, b)
			is.NoErr(err)
			var sum, wsum float64
			for e, v := range y {
				sum += float64(v)
				wsum += float64(v) * float64(e+1)
			}
			is.Equal(sum, tc.sum)
			is.Equal(wsum, tc.wsum)
		})
	}
}
