package clusterpb

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

// RequiredPermission is what the authorization interceptor will do for each
// call: read the option from the method descriptor. Kept in the test so the
// test checks exactly that lookup path.
func requiredPermission(m protoreflect.MethodDescriptor) Permission {
	opts, ok := m.Options().(*descriptorpb.MethodOptions)
	if !ok || opts == nil {
		return Permission_PERMISSION_UNSPECIFIED
	}
	return proto.GetExtension(opts, E_RequiredPermission).(Permission)
}

// TestEveryRPCDeclaresPermission walks every service of every file
// registered under the plinth.cluster.v1 package and fails on any method
// without a valid required_permission, so no RPC can be added without
// deciding who may call it.
func TestEveryRPCDeclaresPermission(t *testing.T) {
	// Referencing the File_ descriptors makes sure each generated file is
	// linked in and registered, even one no other code here touches.
	files := []protoreflect.FileDescriptor{
		File_cluster_v1_authorization_proto,
		File_cluster_v1_common_proto,
		File_cluster_v1_curator_proto,
		File_cluster_v1_management_proto,
		File_cluster_v1_node_management_proto,
	}
	registered := map[string]bool{}
	for _, f := range files {
		registered[f.Path()] = true
	}

	methods := 0
	protoregistry.GlobalFiles.RangeFilesByPackage("plinth.cluster.v1", func(f protoreflect.FileDescriptor) bool {
		if !registered[f.Path()] {
			t.Errorf("%s is registered in plinth.cluster.v1 but missing from this test's list", f.Path())
		}
		delete(registered, f.Path())
		services := f.Services()
		for i := 0; i < services.Len(); i++ {
			s := services.Get(i)
			for j := 0; j < s.Methods().Len(); j++ {
				m := s.Methods().Get(j)
				methods++
				p := requiredPermission(m)
				if p == Permission_PERMISSION_UNSPECIFIED {
					t.Errorf("%s: no (plinth.cluster.v1.required_permission) option", m.FullName())
					continue
				}
				if Permission_name[int32(p)] == "" {
					t.Errorf("%s: required_permission %d is not a known Permission", m.FullName(), p)
				}
			}
		}
		return true
	})
	for path := range registered {
		t.Errorf("%s not found in protoregistry.GlobalFiles under plinth.cluster.v1", path)
	}
	// Guards against the walk silently finding nothing (e.g. a package
	// rename), which would make the test pass vacuously.
	if want := 29; methods != want {
		t.Errorf("walked %d methods, want %d; update the count when adding or removing RPCs", methods, want)
	}
}

// TestEphemeralPermissions pins which RPCs may be called with an ephemeral
// self-signed certificate. These bypass the cluster CA, so widening the
// set must be a deliberate change to this test, not a side effect of
// copying an option line.
func TestEphemeralPermissions(t *testing.T) {
	want := map[protoreflect.FullName]Permission{
		"plinth.cluster.v1.Curator.RegisterNode": Permission_REGISTER_NODE,
		"plinth.cluster.v1.Curator.CommitNode":   Permission_REGISTER_NODE,
		"plinth.cluster.v1.Curator.JoinNode":     Permission_REGISTER_NODE,
		"plinth.cluster.v1.AAA.Escrow":           Permission_ESCROW_OWNERSHIP,
	}
	protoregistry.GlobalFiles.RangeFilesByPackage("plinth.cluster.v1", func(f protoreflect.FileDescriptor) bool {
		for i := 0; i < f.Services().Len(); i++ {
			s := f.Services().Get(i)
			for j := 0; j < s.Methods().Len(); j++ {
				m := s.Methods().Get(j)
				p := requiredPermission(m)
				ephemeral := p == Permission_REGISTER_NODE || p == Permission_ESCROW_OWNERSHIP
				if w, ok := want[m.FullName()]; ok {
					if p != w {
						t.Errorf("%s: permission %v, want %v", m.FullName(), p, w)
					}
				} else if ephemeral {
					t.Errorf("%s: permission %v allows ephemeral callers but the method is not in the allowed list", m.FullName(), p)
				}
			}
		}
		return true
	})
}

// TestEveryPermissionIsGranted: each permission names the caller kinds
// that hold it (granted_to), so the interceptor never guesses.
func TestEveryPermissionIsGranted(t *testing.T) {
	values := Permission_PERMISSION_UNSPECIFIED.Descriptor().Values()
	for i := 0; i < values.Len(); i++ {
		v := values.Get(i)
		kinds := proto.GetExtension(v.Options(), E_GrantedTo).([]CallerKind)
		if Permission(v.Number()) == Permission_PERMISSION_UNSPECIFIED {
			if len(kinds) != 0 {
				t.Errorf("PERMISSION_UNSPECIFIED is granted to %v", kinds)
			}
			continue
		}
		if len(kinds) == 0 {
			t.Errorf("%s is granted to nobody (no granted_to option)", v.Name())
		}
		for _, k := range kinds {
			if k == CallerKind_CALLER_KIND_UNSPECIFIED {
				t.Errorf("%s is granted to CALLER_KIND_UNSPECIFIED", v.Name())
			}
		}
	}
}
