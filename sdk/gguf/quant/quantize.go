package quant

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/dflash/dflash_server/sdk/gguf"
)

type quantFunc func(x []float32, block []byte)

var quantizers = map[gguf.Type]quantFunc{
	gguf.F32:  func(x []float32, b []byte) { binary.LittleEndian.PutUint32(b, math.Float32bits(x[0])) },
	gguf.F16:  func(x []float32, b []byte) { binary.LittleEndian.PutUint16(b, F32ToF16(x[0])) },
	gguf.BF16: func(x []float32, b []byte) { binary.LittleEndian.PutUint16(b, F32ToBF16(x[0])) },
	gguf.I32:  nil, // handled in Quantize
	gguf.Q8_0: quantQ8_0,
	gguf.Q4_0: quantQ4_0,
	gguf.Q4_K: quantQ4_K,
	gguf.Q6_K: quantQ6_K,
}

// CanQuantize reports whether Quantize supports t.
func CanQuantize(t gguf.Type) bool {
	_, ok := quantizers[t]
	return ok
}

// Quantize encodes src as type t into dst. len(src) must be a multiple of t's
// block size and dst must hold at least t.RowSize(len(src)) bytes.
func Quantize(t gguf.Type, src []float32, dst []byte) error {
	fn, ok := quantizers[t]
	if !ok {
		return fmt.Errorf("quantizing to %s is not supported", t)
	}
	if err := checkBlocks("quantize", t, len(src), len(dst)); err != nil {
		return err
	}
	bs, ts := t.BlockSize(), t.TypeSize()
	nb := len(src) / bs
	le := binary.LittleEndian
	switch t { // plain types without a call per element
	case gguf.F32:
		for i, v := range src {
			le.PutUint32(dst[4*i:], math.Float32bits(v))
		}
		return nil
	case gguf.F16:
		for i, v := range src {
			le.PutUint16(dst[2*i:], F32ToF16(v))
		}
		return nil
	case gguf.BF16:
		for i, v := range src {
			le.PutUint16(dst[2*i:], F32ToBF16(v))
		}
		return nil
	case gguf.I32: // integer tables (ids): values are rounded
		for i, v := range src {
			le.PutUint32(dst[4*i:], uint32(int32(math.RoundToEven(float64(v)))))
		}
		return nil
	}
	for i := 0; i < nb; i++ {
		fn(src[i*bs:(i+1)*bs], dst[i*ts:(i+1)*ts])
	}
	return nil
}

// FromFloat32 encodes src as type t into a new slice.
func FromFloat32(t gguf.Type, src []float32) ([]byte, error) {
	if !t.Valid() {
		return nil, fmt.Errorf("quantizing to %s is not supported", t)
	}
	out := make([]byte, t.RowSize(uint64(len(src))))
	return out, Quantize(t, src, out)
}

func putHalf(b []byte, f float32) { binary.LittleEndian.PutUint16(b, F32ToF16(f)) }

// nearestInt rounds half to even, like ggml's nearest_int, with the same
// float trick (valid for |f| < 2^22, which covers every quantizer's codes).
func nearestInt(f float32) int {
	v := f + 12582912 // 1.5·2^23: the sum's low mantissa bits hold round(f)
	return int(int32(math.Float32bits(v)&0x007fffff) - 0x00400000)
}

func clampInt(v, lo, hi int) int { return max(lo, min(hi, v)) }

func quantQ8_0(x []float32, b []byte) {
	var amax float32
	for _, v := range x {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	putHalf(b, d)
	for j, v := range x {
		b[2+j] = byte(int8(math.Round(float64(v * id))))
	}
}

func quantQ4_0(x []float32, b []byte) {
	var amax, vmax float32
	for _, v := range x {
		if a := float32(math.Abs(float64(v))); a > amax {
			amax, vmax = a, v
		}
	}
	d := vmax / -8
	var id float32
	if d != 0 {
		id = 1 / d
	}
	putHalf(b, d)
	for j := 0; j < 16; j++ {
		q0 := min(15, int(int8(x[j]*id+8.5)))
		q1 := min(15, int(int8(x[j+16]*id+8.5)))
		b[2+j] = byte(q0) | byte(q1)<<4
	}
}

// makeQKX2 fits x ≈ scale·L − min with L in [0, nmax] under weights w,
// searching a few scales around the plain min/max fit (ggml's
// make_qkx2_quants). It returns scale and the (non-negative) min. Fixed-size
// arrays keep the inner loops free of bounds checks.
func makeQKX2(x, w *[32]float32, nmax int, L, aux *[32]uint8) (scale, theMin float32) {
	const rmin, rdelta, nstep = -1.0, 0.1, 20
	lo, hi := x[0], x[0]
	var sumW, sumX float32
	for i := range x {
		v := x[i]
		lo, hi = min(lo, v), max(hi, v)
		sumW += w[i]
		sumX += w[i] * v
	}
	lo = min(lo, 0)
	if hi == lo {
		*L = [32]uint8{}
		return 0, -lo
	}
	var xd [32]float32 // x − lo, reused by every trial scale
	for i := range x {
		xd[i] = x[i] - lo
	}
	fn := float32(nmax)
	iscale := fn / (hi - lo)
	scale = 1 / iscale
	var best float32
	for i := range x {
		l := nearestInt(iscale * xd[i])
		l = max(0, min(nmax, l))
		L[i] = uint8(l)
		diff := scale*float32(l) + lo - x[i]
		best += w[i] * diff * diff
	}
	for is := 0; is <= nstep; is++ {
		iscale := (rmin + rdelta*float32(is) + fn) / (hi - lo)
		var sumL, sumL2, sumXL float32
		for i := range x {
			l := nearestInt(iscale * xd[i])
			l = max(0, min(nmax, l))
			aux[i] = uint8(l)
			fl := float32(l)
			wl := w[i] * fl
			sumL += wl
			sumL2 += wl * fl
			sumXL += wl * x[i]
		}
		D := sumW*sumL2 - sumL*sumL
		if D <= 0 {
			continue
		}
		thisScale := (sumW*sumXL - sumX*sumL) / D
		thisMin := (sumL2*sumX - sumL*sumXL) / D
		if thisMin > 0 {
			thisMin = 0
			thisScale = sumXL / sumL2
		}
		var cur float32
		for i := range x {
			diff := thisScale*float32(aux[i]) + thisMin - x[i]
			cur += w[i] * diff * diff
		}
		if cur < best {
			*L = *aux
			best, scale, lo = cur, thisScale, thisMin
			// Later trials measure from the new min, as ggml's do.
			for i := range x {
				xd[i] = x[i] - lo
			}
		}
	}
	return scale, -lo
}

func quantQ4_K(x []float32, b []byte) {
	var (
		L              [qkK]uint8
		aux            [32]uint8
		w              [32]float32
		scales, mins   [8]float32
		maxScale, maxM float32
	)
	for j := 0; j < 8; j++ {
		sub := (*[32]float32)(x[32*j : 32*j+32])
		var sum2 float32
		for _, v := range sub {
			sum2 += v * v
		}
		av := float32(math.Sqrt(float64(sum2 / 32)))
		for l, v := range sub {
			w[l] = av + float32(math.Abs(float64(v)))
		}
		scales[j], mins[j] = makeQKX2(sub, &w, 15, (*[32]uint8)(L[32*j:32*j+32]), &aux)
		maxScale, maxM = max(maxScale, scales[j]), max(maxM, mins[j])
	}
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 63 / maxScale
	}
	if maxM > 0 {
		invMin = 63 / maxM
	}
	s := b[4:16]
	for i := range s {
		s[i] = 0
	}
	for j := 0; j < 8; j++ {
		ls := byte(min(63, nearestInt(invScale*scales[j])))
		lm := byte(min(63, nearestInt(invMin*mins[j])))
		if j < 4 {
			s[j], s[j+4] = ls, lm
		} else {
			s[j+4] = ls&0x0f | lm&0x0f<<4
			s[j-4] |= ls >> 4 << 6
			s[j] |= lm >> 4 << 6
		}
	}
	putHalf(b, maxScale/63)
	putHalf(b[2:], maxM/63)
	d, dmin := half(b), half(b[2:])
	for j := 0; j < 8; j++ {
		sc, m := scaleMinK4(j, s)
		dj := d * float32(sc)
		if dj == 0 {
			continue
		}
		dm := dmin * float32(m)
		for i := 32 * j; i < 32*j+32; i++ {
			L[i] = uint8(clampInt(nearestInt((x[i]+dm)/dj), 0, 15))
		}
	}
	q := b[16:144]
	for j := 0; j < qkK; j += 64 {
		for l := 0; l < 32; l++ {
			q[l] = L[j+l] | L[j+l+32]<<4
		}
		q = q[32:]
	}
}

// makeQX fits x ≈ scale·(L − nmax) with L − nmax in [−nmax, nmax−1],
// weighting by x² and searching scales around the max fit (ggml's
// make_qx_quants with rmse_type 1).
func makeQX(x []float32, nmax int, L []int8) float32 {
	var vmax, amax float32
	for _, v := range x {
		if a := float32(math.Abs(float64(v))); a > amax {
			amax, vmax = a, v
		}
	}
	if amax < 1e-15 {
		for i := range L {
			L[i] = 0
		}
		return 0
	}
	fit := func(iscale float32) (sumLX, sumL2 float32) {
		for _, v := range x {
			l := float32(clampInt(nearestInt(iscale*v), -nmax, nmax-1))
			w := v * v
			sumLX += w * v * l
			sumL2 += w * l * l
		}
		return
	}
	set := func(iscale float32) {
		for i, v := range x {
			L[i] = int8(clampInt(nearestInt(iscale*v), -nmax, nmax-1))
		}
	}
	iscale := -float32(nmax) / vmax
	set(iscale)
	sumLX, sumL2 := fit(iscale)
	var scale float32
	if sumL2 != 0 {
		scale = sumLX / sumL2
	}
	best := scale * sumLX
	for is := -9; is <= 9; is++ {
		if is == 0 {
			continue
		}
		iscale := -(float32(nmax) + 0.1*float32(is)) / vmax
		sumLX, sumL2 := fit(iscale)
		if sumL2 > 0 && sumLX*sumLX > best*sumL2 {
			set(iscale)
			scale = sumLX / sumL2
			best = scale * sumLX
		}
	}
	return scale
}

func quantQ6_K(x []float32, b []byte) {
	var (
		L        [qkK]int8
		scales   [16]float32
		maxScale float32
		maxAbs   float32
	)
	for ib := 0; ib < 16; ib++ {
		scales[ib] = makeQX(x[16*ib:16*ib+16], 32, L[16*ib:16*ib+16])
		if a := float32(math.Abs(float64(scales[ib]))); a > maxAbs {
			maxAbs, maxScale = a, scales[ib]
		}
	}
	if maxAbs < 1e-15 {
		for i := range b {
			b[i] = 0
		}
		return
	}
	iscale := -128 / maxScale
	putHalf(b[208:], 1/iscale)
	sc := b[192:208]
	for ib := range scales {
		sc[ib] = byte(int8(min(127, nearestInt(iscale*scales[ib]))))
	}
	d := half(b[208:])
	var u [qkK]uint8
	for j := 0; j < 16; j++ {
		dj := d * float32(int8(sc[j]))
		if dj == 0 {
			for i := 16 * j; i < 16*j+16; i++ {
				u[i] = 32
			}
			continue
		}
		for i := 16 * j; i < 16*j+16; i++ {
			u[i] = uint8(clampInt(nearestInt(x[i]/dj), -32, 31) + 32)
		}
	}
	ql, qh := b[0:128], b[128:192]
	for j := 0; j < qkK; j += 128 {
		for l := 0; l < 32; l++ {
			q1, q2, q3, q4 := u[j+l], u[j+l+32], u[j+l+64], u[j+l+96]
			ql[l] = q1&0x0f | (q3&0x0f)<<4
			ql[l+32] = q2&0x0f | (q4&0x0f)<<4
			qh[l] = q1>>4 | (q2>>4)<<2 | (q3>>4)<<4 | (q4>>4)<<6
		}
		ql, qh = ql[64:], qh[32:]
	}
}
