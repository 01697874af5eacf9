package launch

import (
	"bufio"
	"bytes"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
)

var policyNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)

func (p *parser) applyGlobals(cfg *Config, h headFlags, given map[string]bool) error {
	g, l := h.globalFlags, h.listenerFlags

	cfg.Host, cfg.Port, cfg.QueueLimit = l.Host, l.Port, l.QueueLimit
	if strings.TrimSpace(l.Host) == "" {
		return usagef("--host must not be empty")
	}
	if l.Port < 0 || l.Port > 65535 {
		return usagef("--port must be between 0 and 65535 (got %d)", l.Port)
	}
	if l.QueueLimit < 0 {
		return usagef("--routing-queue-limit must not be negative (got %d)", l.QueueLimit)
	}
	for _, o := range l.CORSOrigin {
		if !validOrigin(o) {
			return usagef("--cors-origin %q: expected * or scheme://host[:port]", o)
		}
	}
	if len(l.CORSOrigin) > 0 {
		cfg.CORSOrigins = l.CORSOrigin
	}
	for _, k := range l.APIKey {
		if strings.TrimSpace(k) == "" {
			return usagef("--api-key must not be empty")
		}
	}
	cfg.APIKeys = append(cfg.APIKeys, l.APIKey...)
	if given["api-key-file"] {
		keys, err := readKeyFile(l.APIKeyFile)
		if err != nil {
			return &UsageError{Msg: "--api-key-file: " + err.Error(), err: err}
		}
		cfg.APIKeys = append(cfg.APIKeys, keys...)
	}

	if g.QueueTimeout < 0 {
		return usagef("--routing-queue-timeout must not be negative (got %s)", g.QueueTimeout)
	}
	if g.DrainTimeout < 0 {
		return usagef("--drain-timeout must not be negative (got %s)", g.DrainTimeout)
	}
	if g.AdmissionTimeout < 0 {
		return usagef("--admission-timeout must not be negative (got %s)", g.AdmissionTimeout)
	}
	cfg.QueueTimeout, cfg.DrainTimeout, cfg.AdmissionTimeout = g.QueueTimeout, g.DrainTimeout, g.AdmissionTimeout
	cfg.LogLevel, cfg.PluginDir, cfg.ContinueOnLoadFailure = g.LogLevel, g.PluginDir, g.ContinueOnLoadFailure
	cfg.LoadBalancing = g.LoadBalancing

	cfg.Policy = PolicyPrimaryFirst
	if given["routing-policy"] {
		if !policyNamePattern.MatchString(g.RoutingPolicy) {
			return usagef("--routing-policy: %q is not a policy name (lower-case letters, digits, '-', e.g. by-name)", g.RoutingPolicy)
		}
		cfg.Policy = g.RoutingPolicy
	}
	if given["model-routing"] {
		if g.ModelRouting != "name" {
			return usagef("--model-routing must be \"name\" but got %q; choose other policies with --routing-policy", g.ModelRouting)
		}
		if given["routing-policy"] && g.RoutingPolicy != PolicyByName {
			return usagef("--model-routing name means --routing-policy by-name and conflicts with --routing-policy %s", g.RoutingPolicy)
		}
		cfg.Policy = PolicyByName
	}
	cfg.UnknownModel = "reject"
	if given["unknown-model"] {
		if g.UnknownModel != "reject" && g.UnknownModel != "primary" {
			return usagef("--unknown-model must be one of \"reject\",\"primary\" but got %q", g.UnknownModel)
		}
		if cfg.Policy != PolicyByName {
			return usagef("--unknown-model applies only to by-name routing; add --routing-policy by-name (or --model-routing name)")
		}
		cfg.UnknownModel = g.UnknownModel
	}
	if cfg.LoadBalancing && len(cfg.Blocks) < 2 {
		return usagef("--load-balancing needs at least two model blocks (got %d); add another --model <path>", len(cfg.Blocks))
	}
	return nil
}

func validOrigin(o string) bool {
	if o == "*" {
		return true
	}
	u, err := url.Parse(o)
	if err != nil {
		return false
	}
	return (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.Path == "" &&
		u.RawQuery == "" && u.Fragment == "" && u.User == nil
}

// readKeyFile reads one key per line; blank lines and lines starting with
// # are skipped.
func readKeyFile(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var keys []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		keys = append(keys, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%s holds no keys", path)
	}
	return keys, nil
}
