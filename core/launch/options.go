package launch

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/dflash/dflash_server/sdk"
)

// checkOption type-checks a plugin-owned option against its spec and
// returns the value to pass on ("true"/"false" for bools).
func checkOption(occ occurrence) (string, error) {
	s := occ.def.spec
	v := occ.value
	switch s.Kind {
	case sdk.OptionBool:
		if !occ.inline {
			return "true", nil
		}
		switch strings.ToLower(v) {
		case "true", "1", "yes":
			return "true", nil
		case "false", "0", "no":
			return "false", nil
		}
		return "", fmt.Errorf("%s: bool value must be true, 1, yes, false, 0 or no but got %q", occ.display, v)
	case sdk.OptionInt:
		if _, err := strconv.ParseInt(v, 10, 64); err != nil {
			return "", fmt.Errorf("%s: expected a valid 64 bit int but got %q", occ.display, v)
		}
	case sdk.OptionFloat:
		if _, err := strconv.ParseFloat(v, 64); err != nil {
			return "", fmt.Errorf("%s: expected a float but got %q", occ.display, v)
		}
	case sdk.OptionEnum:
		for _, e := range s.Enum {
			if v == e {
				return v, nil
			}
		}
		quoted := make([]string, len(s.Enum))
		for i, e := range s.Enum {
			quoted[i] = strconv.Quote(e)
		}
		return "", fmt.Errorf("%s must be one of %s but got %q", occ.display, strings.Join(quoted, ","), v)
	}
	return v, nil
}

func findSpec(specs []sdk.OptionSpec, name string) (sdk.OptionSpec, bool) {
	for _, s := range specs {
		if s.Name == name {
			return s, true
		}
	}
	return sdk.OptionSpec{}, false
}

// sameValue compares an option value with its default by kind.
func sameValue(s sdk.OptionSpec, v, def string) bool {
	switch s.Kind {
	case sdk.OptionBool:
		return (v == "true") == (strings.EqualFold(def, "true") || def == "1" || strings.EqualFold(def, "yes"))
	case sdk.OptionInt:
		a, err1 := strconv.ParseInt(v, 10, 64)
		b, err2 := strconv.ParseInt(def, 10, 64)
		return err1 == nil && err2 == nil && a == b
	case sdk.OptionFloat:
		a, err1 := strconv.ParseFloat(v, 64)
		b, err2 := strconv.ParseFloat(def, 64)
		return err1 == nil && err2 == nil && a == b
	}
	return v == def
}
