//go:build tools

// Package tools only anchors this wrapper module; it builds no code of its own.
package tools
