package chaosmcp

import (
	"path"
	"slices"
	"sort"
)

// Resource is one entry of the server's resource set.
type Resource struct {
	// URI is the exact string the server lists, reads and notifies.
	URI string
	// Name is the listed name; empty means the last path segment of URI.
	Name string
	// MIMEType is listed and returned by reads.
	MIMEType string
	// Text is the body of a text resource (used when Blob is nil).
	Text string
	// Blob, when non-nil, makes this a binary resource with this body.
	Blob []byte
}

// Template is one entry of resources/templates/list.
type Template struct {
	// URITemplate is the RFC 6570 template, e.g. "demo://notes/{id}".
	URITemplate string
	// Name is the listed name.
	Name string
	// MIMEType is the listed MIME type.
	MIMEType string
}

// Set stores a text resource (creating or replacing it). A new URI sends
// notifications/resources/list_changed to every session that negotiated listChanged; every
// Set sends notifications/resources/updated to the sessions subscribed to exactly uri, even
// when the body did not change.
func (s *Server) Set(uri, text, mimeType string) {
	s.PutMany(Resource{URI: uri, Text: text, MIMEType: mimeType})
}

// SetBlob stores a binary resource; notifications as for [Server.Set].
func (s *Server) SetBlob(uri string, data []byte, mimeType string) {
	if data == nil {
		data = []byte{}
	}
	s.PutMany(Resource{URI: uri, Blob: data, MIMEType: mimeType})
}

// Put stores r; notifications as for [Server.Set].
func (s *Server) Put(r Resource) { s.PutMany(r) }

// PutMany stores several resources at once: at most one list_changed notification is sent
// for the whole batch, and one updated notification per stored URI with subscribers.
// Resources with an empty URI are ignored.
func (s *Server) PutMany(rs ...Resource) {
	s.mu.Lock()
	added := false
	var uris []string
	for _, r := range rs {
		if r.URI == "" {
			continue
		}
		r := r
		if r.Name == "" {
			r.Name = defaultName
			if base := path.Base(r.URI); base != "" && base != "." && base != "/" {
				r.Name = base
			}
		}
		if r.Blob != nil {
			r.Blob = slices.Clone(r.Blob)
			r.Text = ""
		}
		old, ok := s.resources[r.URI]
		if !ok {
			added = true
		}
		if !ok || old.Name != r.Name || old.MIMEType != r.MIMEType {
			s.catalogVersion++
		}
		s.resources[r.URI] = &r
		uris = append(uris, r.URI)
	}
	s.changedLocked()
	s.mu.Unlock()
	if added {
		s.notifyListChanged()
	}
	for _, u := range uris {
		s.notifyUpdated(u)
	}
}

// Delete removes a resource. If it existed, list_changed is sent (as for a new URI) and the
// sessions subscribed to uri get notifications/resources/updated, so that their next read
// observes the deletion. It reports whether the resource existed.
func (s *Server) Delete(uri string) bool {
	s.mu.Lock()
	_, ok := s.resources[uri]
	if ok {
		delete(s.resources, uri)
		s.catalogVersion++
		s.changedLocked()
	}
	s.mu.Unlock()
	if ok {
		s.notifyListChanged()
		s.notifyUpdated(uri)
	}
	return ok
}

// Get returns a copy of the resource stored under exactly uri.
func (s *Server) Get(uri string) (Resource, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.resources[uri]
	if !ok {
		return Resource{}, false
	}
	c := *r
	c.Blob = slices.Clone(r.Blob)
	return c, true
}

// URIs returns the URIs of the resource set, sorted.
func (s *Server) URIs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.sortedLocked(ListResources))
}

// SetTemplate adds or replaces a resource template; a new template sends list_changed.
// Templates are listed only: reads are answered from the resource set.
func (s *Server) SetTemplate(t Template) {
	s.mu.Lock()
	old, ok := s.templates[t.URITemplate]
	if !ok || *old != t {
		s.catalogVersion++
	}
	s.templates[t.URITemplate] = &t
	s.changedLocked()
	s.mu.Unlock()
	if !ok {
		s.notifyListChanged()
	}
}

// DeleteTemplate removes a template (sending list_changed) and reports whether it existed.
func (s *Server) DeleteTemplate(uriTemplate string) bool {
	s.mu.Lock()
	_, ok := s.templates[uriTemplate]
	if ok {
		delete(s.templates, uriTemplate)
		s.catalogVersion++
		s.changedLocked()
	}
	s.mu.Unlock()
	if ok {
		s.notifyListChanged()
	}
	return ok
}

// Templates returns the templates, sorted by URI template.
func (s *Server) Templates() []Template {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Template
	for _, k := range s.sortedLocked(ListTemplates) {
		out = append(out, *s.templates[k])
	}
	return out
}

// sortedLocked returns the sorted keys of a list kind, cached per catalog version.
func (s *Server) sortedLocked(kind ListKind) []string {
	if s.sortedAt != s.catalogVersion {
		clear(s.sorted)
		s.sortedAt = s.catalogVersion
	}
	if keys, ok := s.sorted[kind]; ok {
		return keys
	}
	var keys []string
	if kind == ListTemplates {
		for k := range s.templates {
			keys = append(keys, k)
		}
	} else {
		for k := range s.resources {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	s.sorted[kind] = keys
	return keys
}
