package lease

// MaxIdentifierLen is the longest identifier the contract accepts, in bytes.
const MaxIdentifierLen = 256

// ValidIdentifier reports whether s follows the identifier rule of CONTRACT
// §2: 1–256 bytes, each in [A-Za-z0-9] or one of - _ . : /
func ValidIdentifier(s string) bool {
	if len(s) == 0 || len(s) > MaxIdentifierLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '-', c == '_', c == '.', c == ':', c == '/':
		default:
			return false
		}
	}
	return true
}

// ValidPolicyDigest reports whether s is exactly 64 lowercase hex digits.
func ValidPolicyDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Field names the binding fields in validation order.
func (b Binding) Fields() [4]struct{ Name, Value string } {
	return [4]struct{ Name, Value string }{
		{"organization_id", b.OrganizationID},
		{"workspace_id", b.WorkspaceID},
		{"thread_id", b.ThreadID},
		{"runner_session_id", b.RunnerSessionID},
	}
}
