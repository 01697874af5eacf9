// Package nativetest finds what the tests of native-engine backends need
// and make builds: the CPU engine library and the dflash-model tool.
package nativetest
