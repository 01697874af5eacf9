package sdk

// APIVersion is reported in Info so the core can refuse plugins built
// against an incompatible SDK before loading anything.
const APIVersion = 1
