package transport

import (
	"context"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/dflash/dflash_server/sdk"
	policyv1 "github.com/dflash/dflash_server/sdk/proto/dflash/policy/v1"
)

// PolicyPlugin is the go-plugin glue for the policy kind.
type PolicyPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Impl sdk.Policy
}

var _ plugin.GRPCPlugin = (*PolicyPlugin)(nil)

// GRPCServer registers the plugin-side adapter.
func (p *PolicyPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	policyv1.RegisterPolicyServiceServer(s, &policyServer{impl: p.Impl})
	return nil
}

// GRPCClient returns the host-side adapter.
func (p *PolicyPlugin) GRPCClient(ctx context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &PolicyClient{rpc: policyv1.NewPolicyServiceClient(c), done: ctx}, nil
}

type policyServer struct {
	policyv1.UnimplementedPolicyServiceServer
	impl sdk.Policy
}

func (s *policyServer) Info(ctx context.Context, _ *policyv1.InfoRequest) (*policyv1.InfoResponse, error) {
	info, err := s.impl.Info(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	r := &policyv1.InfoResponse{Name: info.Name, ApiVersion: int32(info.APIVersion)}
	if r.ApiVersion == 0 {
		r.ApiVersion = sdk.APIVersion
	}
	for _, o := range info.Options {
		r.Options = append(r.Options, &policyv1.OptionSpec{Name: o.Name, DefaultValue: o.Default, Help: o.Help, EnumValues: o.Enum})
	}
	return r, nil
}

func (s *policyServer) Configure(ctx context.Context, req *policyv1.ConfigureRequest) (*policyv1.ConfigureResponse, error) {
	if err := s.impl.Configure(ctx, req.GetOptions()); err != nil {
		return nil, toStatus(err)
	}
	return &policyv1.ConfigureResponse{}, nil
}

func (s *policyServer) Order(ctx context.Context, req *policyv1.OrderRequest) (*policyv1.OrderResponse, error) {
	d, err := s.impl.Order(ctx, snapshotFromProto(req))
	if err != nil {
		return nil, toStatus(err)
	}
	return &policyv1.OrderResponse{Order: d.Order, Pin: d.Pin, NotFound: d.NotFound, Message: d.Message}, nil
}

// PolicyClient is the host-side Policy over gRPC.
type PolicyClient struct {
	rpc  policyv1.PolicyServiceClient
	done context.Context
}

var _ sdk.Policy = (*PolicyClient)(nil)

// Exited is closed when the plugin process has gone away.
func (c *PolicyClient) Exited() <-chan struct{} { return c.done.Done() }

func (c *PolicyClient) Info(ctx context.Context) (sdk.PolicyInfo, error) {
	r, err := c.rpc.Info(ctx, &policyv1.InfoRequest{})
	if err != nil {
		return sdk.PolicyInfo{}, fromStatus(ctx, err)
	}
	info := sdk.PolicyInfo{Name: r.GetName(), APIVersion: int(r.GetApiVersion())}
	for _, o := range r.GetOptions() {
		info.Options = append(info.Options, sdk.OptionSpec{Name: o.GetName(), Default: o.GetDefaultValue(), Help: o.GetHelp(), Enum: o.GetEnumValues()})
	}
	return info, nil
}

func (c *PolicyClient) Configure(ctx context.Context, opts map[string]string) error {
	_, err := c.rpc.Configure(ctx, &policyv1.ConfigureRequest{Options: opts})
	return fromStatus(ctx, err)
}

func (c *PolicyClient) Order(ctx context.Context, snap sdk.Snapshot) (sdk.Decision, error) {
	r, err := c.rpc.Order(ctx, snapshotToProto(snap))
	if err != nil {
		return sdk.Decision{}, fromStatus(ctx, err)
	}
	return sdk.Decision{Order: r.GetOrder(), Pin: r.GetPin(), NotFound: r.GetNotFound(), Message: r.GetMessage()}, nil
}
