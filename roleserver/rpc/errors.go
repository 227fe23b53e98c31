package rpc

import (
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
)

// ErrorDomain is the domain of the ErrorInfo details Plinth's services
// attach to their errors.
const ErrorDomain = "plinth.dev"

// Error is a gRPC status error with code and message that also carries
// reason as a google.rpc.ErrorInfo detail, for clients that must act on
// why a call failed (see Reason). The message is for people only.
func Error(code codes.Code, reason clusterpb.ErrorReason, format string, args ...any) error {
	st := status.New(code, fmt.Sprintf(format, args...))
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason.String(), Domain: ErrorDomain}); err == nil {
		st = d
	}
	return st.Err()
}

// Reason returns the ErrorReason a status error carries (see Error), or
// ERROR_REASON_UNSPECIFIED. Wrapped status errors are found too.
func Reason(err error) clusterpb.ErrorReason {
	var se interface{ GRPCStatus() *status.Status }
	if err == nil || !errors.As(err, &se) {
		return clusterpb.ErrorReason_ERROR_REASON_UNSPECIFIED
	}
	for _, d := range se.GRPCStatus().Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			if v, ok := clusterpb.ErrorReason_value[info.GetReason()]; ok {
				return clusterpb.ErrorReason(v)
			}
		}
	}
	return clusterpb.ErrorReason_ERROR_REASON_UNSPECIFIED
}
