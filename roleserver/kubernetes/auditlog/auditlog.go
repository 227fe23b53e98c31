// Package auditlog keeps the API server's audit events on the node's
// encrypted data volume, in classes with a byte budget each, so that
// nothing one kind of caller does evicts another kind's events, and so
// that they outlive a reboot.
//
//	API server stdout (one JSON event per line)
//	   │
//	   ▼ Classify (user, verb, resource)
//	   ├─► interactive.log  exec, attach, port-forward; RBAC changes; the owner's changes
//	   ├─► changes.log      other changes by users and their workloads
//	   ├─► system.log       nodes and the control plane's own components
//	   ├─► reads.log        reads by authenticated users
//	   └─► anonymous.log    unauthenticated requests
//	each: <class>.log and <class>.log.1, rotated at half the class's budget
//
// Why classes and not one ring: an audit log that anyone who can send a
// request can flush is no audit log. A tenant's reads, or anyone's
// unauthenticated probes, fill only their own class; the owner's exec
// into a pod stays. Guarded by TestStoreBudgets and TestControlPlaneOnHost
// (checkAuditPersists).
package auditlog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// Class is a kind of caller and request.
type Class string

const (
	ClassInteractive Class = "interactive"
	ClassChanges     Class = "changes"
	ClassSystem      Class = "system"
	ClassReads       Class = "reads"
	ClassAnonymous   Class = "anonymous"
)

// Classes are every class, in the order Read merges ties.
var Classes = []Class{ClassInteractive, ClassChanges, ClassSystem, ClassReads, ClassAnonymous}

// DefaultBudgets are the bytes each class may keep on disk: 120 MiB in
// all, some 100,000 Metadata events.
var DefaultBudgets = map[Class]int64{
	ClassInteractive: 32 << 20,
	ClassChanges:     32 << 20,
	ClassSystem:      32 << 20,
	ClassReads:       16 << 20,
	ClassAnonymous:   8 << 20,
}

// ownerPrefix is the user name prefix of the owner's certificates
// (roleserver/kubernetes/pki.OwnerPrefix).
const ownerPrefix = "plinth-owner:"

// systemUsers are the user name prefixes of nodes and of the control
// plane's and Plinth's own components.
var systemUsers = []string{"system:node:", "system:kube-", "system:serviceaccount:kube-system:", "system:apiserver",
	"plinth:", "plinth-controller:", "kube-apiserver-kubelet-client"}

// event is what Classify reads of an audit event.
type event struct {
	Verb             string    `json:"verb"`
	User             userInfo  `json:"user"`
	ImpersonatedUser *userInfo `json:"impersonatedUser"`
	ObjectRef        struct {
		APIGroup    string `json:"apiGroup"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	StageTimestamp time.Time `json:"stageTimestamp"`
}

type userInfo struct {
	Username string   `json:"username"`
	Groups   []string `json:"groups"`
}

var writeVerbs = []string{"create", "update", "patch", "delete", "deletecollection"}

// Classify is line's class (an event that does not parse: system's,
// where nobody else's can be evicted by it).
func Classify(line []byte) Class {
	var e event
	if json.Unmarshal(line, &e) != nil {
		return ClassSystem
	}
	// Whom a request impersonates is whose request it is.
	u := e.User
	if e.ImpersonatedUser != nil {
		u = *e.ImpersonatedUser
	}
	user := u.Username
	write := slices.Contains(writeVerbs, e.Verb)
	switch {
	case user == "system:anonymous" || slices.Contains(u.Groups, "system:unauthenticated"):
		return ClassAnonymous
	case slices.Contains([]string{"exec", "attach", "portforward"}, e.ObjectRef.Subresource),
		write && e.ObjectRef.APIGroup == "rbac.authorization.k8s.io",
		write && strings.HasPrefix(user, ownerPrefix):
		return ClassInteractive
	case slices.ContainsFunc(systemUsers, func(p string) bool { return strings.HasPrefix(user, p) }),
		slices.Contains(u.Groups, "system:nodes"):
		return ClassSystem
	case write:
		return ClassChanges
	}
	return ClassReads
}

// Store is the audit log in a directory.
type Store struct {
	dir     string
	budgets map[Class]int64

	mu      sync.Mutex
	partial []byte
	files   map[Class]*os.File
	sizes   map[Class]int64
	// failed counts events that could not be written (a full disk): the
	// API server's output must never block on the store.
	failed int64
}

// Open opens the store in dir (made if missing) with budgets (nil:
// DefaultBudgets).
func Open(dir string, budgets map[Class]int64) (*Store, error) {
	if budgets == nil {
		budgets = DefaultBudgets
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return &Store{dir: dir, budgets: budgets, files: map[Class]*os.File{}, sizes: map[Class]int64{}}, nil
}

func (s *Store) path(c Class) string { return filepath.Join(s.dir, string(c)+".log") }

// Write takes the API server's output: complete lines are events, each
// appended to its class's file. It never fails: an event that cannot be
// written is counted (Failed) and dropped.
func (s *Store) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.partial = append(s.partial, p...)
	for {
		i := bytes.IndexByte(s.partial, '\n')
		if i < 0 {
			break
		}
		line := s.partial[:i+1]
		if len(bytes.TrimSpace(line)) > 0 {
			if err := s.append(Classify(line), line); err != nil {
				s.failed++
			}
		}
		s.partial = s.partial[i+1:]
	}
	// A line longer than any event (the API server truncates them)
	// is not one: dropped rather than kept growing.
	if len(s.partial) > 1<<20 {
		s.partial, s.failed = nil, s.failed+1
	}
	return len(p), nil
}

// append writes line to c's file, rotating it first when it would pass
// half the class's budget.
func (s *Store) append(c Class, line []byte) error {
	f := s.files[c]
	if f == nil {
		var err error
		if f, err = os.OpenFile(s.path(c), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err != nil {
			return err
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return err
		}
		s.files[c], s.sizes[c] = f, st.Size()
	}
	if s.sizes[c] > 0 && s.sizes[c]+int64(len(line)) > s.budgets[c]/2 {
		f.Close()
		delete(s.files, c)
		if err := os.Rename(s.path(c), s.path(c)+".1"); err != nil {
			return err
		}
		s.sizes[c] = 0
		return s.append(c, line)
	}
	n, err := f.Write(line)
	s.sizes[c] += int64(n)
	return err
}

// Failed is how many events could not be kept.
func (s *Store) Failed() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

// Close closes the files.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for c, f := range s.files {
		errs = append(errs, f.Close())
		delete(s.files, c)
	}
	return errors.Join(errs...)
}

// Event is one event as Read returns it.
type Event struct {
	Time  time.Time
	Class Class
	Line  string
}

// Read returns every event kept in dir, oldest first (by the event's
// stageTimestamp; a line without one keeps its place in its file).
func Read(dir string) ([]Event, error) {
	var out []Event
	for _, c := range Classes {
		base := filepath.Join(dir, string(c)+".log")
		for _, p := range []string{base + ".1", base} {
			f, err := os.Open(p)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, err
			}
			sc := bufio.NewScanner(f)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			var last time.Time
			for sc.Scan() {
				var e event
				if json.Unmarshal(sc.Bytes(), &e) == nil && !e.StageTimestamp.IsZero() {
					last = e.StageTimestamp
				}
				out = append(out, Event{Time: last, Class: c, Line: sc.Text()})
			}
			err = sc.Err()
			f.Close()
			if err != nil {
				return nil, err
			}
		}
	}
	slices.SortStableFunc(out, func(a, b Event) int { return a.Time.Compare(b.Time) })
	return out, nil
}
