package auth

import "time"

// IntrospectionFailedFor is how long an authorization server that failed
// an introspection is not asked again.
const IntrospectionFailedFor = time.Second
