package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRecordLogRotationFailureKeepsLines: when the rotation's rename
// fails (FILE.1 cannot be replaced: here a directory; in production a log
// folder the service may not write to, FILE itself writable), Write
// reopens FILE and then drops the line it was given, and every later line
// too (each tries the rotation again): the record log silently stops
// recording once it reaches --record-log-max (until stop 64: a red team).
// The lines are kept, and the failure said (Write's error).
func TestRecordLogRotationFailureKeepsLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "records.log")
	if err := os.MkdirAll(filepath.Join(path+".1", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := openRecordLog(path, 100)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	line := func(c string) []byte { return []byte(strings.Repeat(c, 79) + "\n") }
	if _, err := l.Write(line("a")); err != nil {
		t.Fatal(err)
	}
	_, err = l.Write(line("b"))
	if err == nil {
		t.Error("a failed rotation was not said")
	}
	l.Write(line("c"))
	b, _ := os.ReadFile(path)
	if !strings.Contains(string(b), "bbbb") || !strings.Contains(string(b), "cccc") {
		t.Errorf("lines written after a failed rotation are lost (Write: %v); the file holds %d bytes", err, len(b))
	}
}
