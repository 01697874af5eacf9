// Package byname is the by-name routing policy: a request whose model field
// names a loaded model is pinned to it (Decision.Pin: it waits for that
// model and never spills to another); an omitted, empty or "auto" name is
// balanced primary-first; an unknown name is refused with the list of
// loaded models, or served by the primary with unknown-model=primary.
package byname
