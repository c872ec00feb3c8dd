package main

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// defaultRecordLogMax is the size at which the record log is rotated: a
// plugin that writes records at its budget's rate (64 KiB a second) fills
// it in about half an hour, and the log never takes more than twice it.
const defaultRecordLogMax = "100MiB"

// recordLog is the file behind --record-log: appended to, and rotated once
// a line would take it past max bytes (0 means never). Rotation renames
// FILE to FILE.1, replacing the older one, and starts FILE afresh, so the
// log takes at most about twice max on disk. Lines are never split. It is
// safe for concurrent use.
type recordLog struct {
	mu   sync.Mutex
	path string
	max  int64
	f    *os.File
	size int64
	// retry is when a rotation that failed is tried again.
	retry  time.Time
	closed bool // by Close
}

func openRecordLog(path string, max int64) (*recordLog, error) {
	l := &recordLog{path: path, max: max}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *recordLog) open() error {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		return errors.Join(err, f.Close())
	}
	l.f, l.size = f, st.Size()
	return nil
}

// Write appends p, one or more whole lines, rotating the file first if p
// would take it past max.
func (l *recordLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return 0, errors.New("record log: closed")
	}
	if l.f == nil {
		// A rotation renamed FILE but could not open it again: tried
		// again with each line.
		if err := l.open(); err != nil {
			return 0, fmt.Errorf("record log: reopen: %w", err)
		}
	}
	var rerr error
	if l.max > 0 && l.size > 0 && l.size+int64(len(p)) > l.max && !time.Now().Before(l.retry) {
		if err := l.rotate(); err != nil {
			// The line is kept all the same, in FILE past max, and the
			// rotation tried again a while later: a record log that can
			// no longer rotate (FILE.1 not replaceable, the folder not
			// writable) went on dropping every line (a red team, stop
			// 64). The error goes to the caller, which logs it.
			rerr = fmt.Errorf("record log: rotate: %w (tried again in %v; the log grows past its size meanwhile)", err, rotateRetry)
			l.retry = time.Now().Add(rotateRetry)
			if l.f == nil {
				return 0, rerr
			}
		}
	}
	n, err := l.f.Write(p)
	l.size += int64(n)
	return n, errors.Join(err, rerr)
}

// rotateRetry is how long after a failed rotation the next is tried.
const rotateRetry = time.Minute

func (l *recordLog) rotate() error {
	// The descriptor is released even when Close fails: FILE is opened
	// again whatever happens.
	cerr := l.f.Close()
	l.f = nil
	if err := os.Rename(l.path, l.path+".1"); err != nil {
		return errors.Join(cerr, err, l.open())
	}
	return errors.Join(cerr, l.open())
}

// Close closes the file. It is idempotent.
func (l *recordLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
