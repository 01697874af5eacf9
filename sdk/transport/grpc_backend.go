package transport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/dflash/dflash_server/sdk"
	backendv1 "github.com/dflash/dflash_server/sdk/proto/dflash/backend/v1"
)

// BackendPlugin is the go-plugin glue for the backend kind. Plugin binaries
// set Impl (through ServeBackend); the host leaves it nil and gets a
// *BackendClient from Dispense.
type BackendPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Impl sdk.Backend
}

var _ plugin.GRPCPlugin = (*BackendPlugin)(nil)

// GRPCServer registers the plugin-side adapter.
func (p *BackendPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	backendv1.RegisterBackendServiceServer(s, &backendServer{impl: p.Impl})
	return nil
}

// GRPCClient returns the host-side adapter. ctx lives as long as the plugin
// process.
func (p *BackendPlugin) GRPCClient(ctx context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &BackendClient{rpc: backendv1.NewBackendServiceClient(c), done: ctx}, nil
}

// cancelDrainLimit bounds how long the host keeps reading a cancelled
// stream, waiting for the plugin to retire the sequence, before it gives up
// on a wedged plugin.
const cancelDrainLimit = time.Minute

// backendServer adapts a Backend implementation to the generated service.
type backendServer struct {
	backendv1.UnimplementedBackendServiceServer
	impl sdk.Backend

	mu      sync.Mutex
	streams map[string]context.CancelFunc
}

func (s *backendServer) Info(ctx context.Context, _ *backendv1.InfoRequest) (*backendv1.InfoResponse, error) {
	info, err := s.impl.Info(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	r := &backendv1.InfoResponse{
		Name: info.Name, Architectures: info.Architectures, Devices: info.Devices, ApiVersion: int32(info.APIVersion),
	}
	if r.ApiVersion == 0 {
		r.ApiVersion = sdk.APIVersion
	}
	for _, o := range info.Options {
		r.Options = append(r.Options, optionToProto(o))
	}
	return r, nil
}

func (s *backendServer) ValidateOptions(ctx context.Context, req *backendv1.ValidateOptionsRequest) (*backendv1.ValidateOptionsResponse, error) {
	if err := s.impl.ValidateOptions(ctx, configFromProto(req.GetConfig())); err != nil {
		return nil, toStatus(err)
	}
	return &backendv1.ValidateOptionsResponse{}, nil
}

func (s *backendServer) Load(req *backendv1.LoadRequest, stream grpc.ServerStreamingServer[backendv1.LoadResponse]) error {
	progress := func(p sdk.LoadProgress) {
		// Progress is best effort: a failed send surfaces on the final one.
		_ = stream.Send(&backendv1.LoadResponse{Msg: &backendv1.LoadResponse_Progress{Progress: &backendv1.LoadProgress{
			Stage: p.Stage, BytesDone: p.BytesDone, BytesTotal: p.BytesTotal,
		}}})
	}
	desc, err := s.impl.Load(stream.Context(), configFromProto(req.GetConfig()), progress)
	if err != nil {
		return toStatus(err)
	}
	return stream.Send(&backendv1.LoadResponse{Msg: &backendv1.LoadResponse_Description{Description: descToProto(desc)}})
}

func (s *backendServer) Start(req *backendv1.StartRequest, stream grpc.ServerStreamingServer[backendv1.StartResponse]) error {
	var cr sdk.ChatRequest
	if err := json.Unmarshal(req.GetChatRequestJson(), &cr); err != nil {
		return toStatus(sdk.Invalidf("decode chat request: %v", err))
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	if id := req.GetStreamId(); id != "" {
		s.mu.Lock()
		if s.streams == nil {
			s.streams = map[string]context.CancelFunc{}
		}
		s.streams[id] = cancel
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			delete(s.streams, id)
			s.mu.Unlock()
		}()
	}
	return toStatus(s.impl.Start(ctx, &cr, &streamEmitter{stream: stream}))
}

func (s *backendServer) Cancel(_ context.Context, req *backendv1.CancelRequest) (*backendv1.CancelResponse, error) {
	s.mu.Lock()
	cancel := s.streams[req.GetStreamId()]
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	return &backendv1.CancelResponse{}, nil
}

// streamEmitter sends a Start stream's messages; Send blocks under gRPC flow
// control when the host stops reading.
type streamEmitter struct {
	stream   grpc.ServerStreamingServer[backendv1.StartResponse]
	admitted bool
}

func (e *streamEmitter) Admit(a sdk.Admission) error {
	if e.admitted {
		return errors.New("admission already sent")
	}
	e.admitted = true
	return e.stream.Send(&backendv1.StartResponse{Msg: &backendv1.StartResponse_Admission{Admission: admissionToProto(a)}})
}

func (e *streamEmitter) Emit(ev sdk.Event) error {
	if !e.admitted {
		return errors.New("event before admission")
	}
	return e.stream.Send(&backendv1.StartResponse{Msg: &backendv1.StartResponse_Event{Event: eventToProto(ev)}})
}

func (s *backendServer) Tokenize(ctx context.Context, req *backendv1.TokenizeRequest) (*backendv1.TokenizeResponse, error) {
	ids, err := s.impl.Tokenize(ctx, req.GetText(), req.GetAddSpecial())
	if err != nil {
		return nil, toStatus(err)
	}
	return &backendv1.TokenizeResponse{Ids: ids}, nil
}

func (s *backendServer) Detokenize(ctx context.Context, req *backendv1.DetokenizeRequest) (*backendv1.DetokenizeResponse, error) {
	text, err := s.impl.Detokenize(ctx, req.GetIds())
	if err != nil {
		return nil, toStatus(err)
	}
	return &backendv1.DetokenizeResponse{Text: modelBytes(text)}, nil
}

func (s *backendServer) CountTokens(ctx context.Context, req *backendv1.CountTokensRequest) (*backendv1.CountTokensResponse, error) {
	var cr sdk.ChatRequest
	if err := json.Unmarshal(req.GetChatRequestJson(), &cr); err != nil {
		return nil, toStatus(sdk.Invalidf("decode chat request: %v", err))
	}
	n, err := s.impl.CountTokens(ctx, &cr)
	if err != nil {
		return nil, toStatus(err)
	}
	return &backendv1.CountTokensResponse{Tokens: int32(n)}, nil
}

func (s *backendServer) Stats(ctx context.Context, _ *backendv1.StatsRequest) (*backendv1.StatsResponse, error) {
	st, err := s.impl.Stats(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	return statsToProto(st), nil
}

func (s *backendServer) Shutdown(ctx context.Context, _ *backendv1.ShutdownRequest) (*backendv1.ShutdownResponse, error) {
	if err := s.impl.Shutdown(ctx); err != nil {
		return nil, toStatus(err)
	}
	return &backendv1.ShutdownResponse{}, nil
}

// BackendClient is the host-side Backend over gRPC. It translates gRPC
// status codes into the sdk's domain errors (ErrUnavailable when the plugin
// process is gone, *InvalidError for refused input).
type BackendClient struct {
	rpc     backendv1.BackendServiceClient
	done    context.Context
	streams atomic.Uint64
}

var _ sdk.Backend = (*BackendClient)(nil)

// Exited is closed when the plugin process has gone away.
func (c *BackendClient) Exited() <-chan struct{} { return c.done.Done() }

func (c *BackendClient) Info(ctx context.Context) (sdk.BackendInfo, error) {
	r, err := c.rpc.Info(ctx, &backendv1.InfoRequest{})
	if err != nil {
		return sdk.BackendInfo{}, fromStatus(ctx, err)
	}
	info := sdk.BackendInfo{Name: r.GetName(), Architectures: r.GetArchitectures(), Devices: r.GetDevices(), APIVersion: int(r.GetApiVersion())}
	for _, o := range r.GetOptions() {
		info.Options = append(info.Options, optionFromProto(o))
	}
	return info, nil
}

func (c *BackendClient) ValidateOptions(ctx context.Context, cfg sdk.ModelConfig) error {
	_, err := c.rpc.ValidateOptions(ctx, &backendv1.ValidateOptionsRequest{Config: configToProto(cfg)})
	return fromStatus(ctx, err)
}

func (c *BackendClient) Load(ctx context.Context, cfg sdk.ModelConfig, progress func(sdk.LoadProgress)) (sdk.ModelDescription, error) {
	stream, err := c.rpc.Load(ctx, &backendv1.LoadRequest{Config: configToProto(cfg)})
	if err != nil {
		return sdk.ModelDescription{}, fromStatus(ctx, err)
	}
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			return sdk.ModelDescription{}, errors.New("load ended without a model description")
		}
		if err != nil {
			return sdk.ModelDescription{}, fromStatus(ctx, err)
		}
		switch msg := m.GetMsg().(type) {
		case *backendv1.LoadResponse_Progress:
			if progress != nil {
				p := msg.Progress
				progress(sdk.LoadProgress{Stage: p.GetStage(), BytesDone: p.GetBytesDone(), BytesTotal: p.GetBytesTotal()})
			}
		case *backendv1.LoadResponse_Description:
			return descFromProto(msg.Description), nil
		}
	}
}

// Start opens the stream and relays it to emit. When ctx is cancelled or
// emit fails, it asks the plugin to cancel (Cancel RPC) and keeps reading,
// without relaying, until the plugin ends the stream: Start returns only
// once the engine has retired the sequence, so the caller's reservation
// covers all device work.
func (c *BackendClient) Start(ctx context.Context, req *sdk.ChatRequest, emit sdk.Emitter) error {
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("encode chat request: %w", err)
	}
	id := strconv.FormatUint(c.streams.Add(1), 10)
	// The stream lives with the plugin process, not with ctx: dropping it
	// on cancellation would hide when the plugin actually stops.
	sctx, scancel := context.WithCancel(c.done)
	defer scancel()
	stream, err := c.rpc.Start(sctx, &backendv1.StartRequest{ChatRequestJson: body, StreamId: id})
	if err != nil {
		return fromStatus(ctx, err)
	}
	var once sync.Once
	var stopErr error
	stopCh := make(chan struct{})
	// stopped returns the cause once cancellation began; the channel close
	// orders the write of stopErr before any read.
	stopped := func() error {
		select {
		case <-stopCh:
			return stopErr
		default:
			return nil
		}
	}
	cancelPlugin := func(cause error) {
		once.Do(func() {
			stopErr = cause
			close(stopCh)
			go func() {
				cctx, cc := context.WithTimeout(c.done, 5*time.Second)
				defer cc()
				_, _ = c.rpc.Cancel(cctx, &backendv1.CancelRequest{StreamId: id})
			}()
			time.AfterFunc(cancelDrainLimit, scancel)
		})
	}
	stopWatch := context.AfterFunc(ctx, func() { cancelPlugin(ctx.Err()) })
	defer stopWatch()

	admitted := false
	for {
		m, err := stream.Recv()
		if cause := stopped(); cause != nil && err != nil {
			return cause // the plugin has ended the cancelled stream
		}
		if err == io.EOF {
			if !admitted {
				return errors.New("backend ended the stream without an admission")
			}
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if c.done.Err() != nil {
				// The stream lives with the process: its end shows up as a
				// cancellation here, but the cause is the process exit.
				return fmt.Errorf("%w: plugin process exited", sdk.ErrUnavailable)
			}
			return fromStatus(ctx, err)
		}
		if stopped() != nil || ctx.Err() != nil {
			continue // draining a cancelled stream
		}
		switch msg := m.GetMsg().(type) {
		case *backendv1.StartResponse_Admission:
			admitted = true
			if err := emit.Admit(admissionFromProto(msg.Admission)); err != nil {
				cancelPlugin(err)
			}
		case *backendv1.StartResponse_Event:
			if !admitted {
				cancelPlugin(errors.New("backend sent an event before its admission"))
				continue
			}
			if err := emit.Emit(eventFromProto(msg.Event)); err != nil {
				cancelPlugin(err)
			}
		}
	}
}

func (c *BackendClient) Tokenize(ctx context.Context, text string, addSpecial bool) ([]int32, error) {
	r, err := c.rpc.Tokenize(ctx, &backendv1.TokenizeRequest{Text: text, AddSpecial: addSpecial})
	if err != nil {
		return nil, fromStatus(ctx, err)
	}
	return r.GetIds(), nil
}

func (c *BackendClient) Detokenize(ctx context.Context, ids []int32) (string, error) {
	r, err := c.rpc.Detokenize(ctx, &backendv1.DetokenizeRequest{Ids: ids})
	if err != nil {
		return "", fromStatus(ctx, err)
	}
	return string(r.GetText()), nil
}

func (c *BackendClient) CountTokens(ctx context.Context, req *sdk.ChatRequest) (int, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return 0, fmt.Errorf("encode chat request: %w", err)
	}
	r, err := c.rpc.CountTokens(ctx, &backendv1.CountTokensRequest{ChatRequestJson: body})
	if err != nil {
		return 0, fromStatus(ctx, err)
	}
	return int(r.GetTokens()), nil
}

func (c *BackendClient) Stats(ctx context.Context) (sdk.ModelStats, error) {
	r, err := c.rpc.Stats(ctx, &backendv1.StatsRequest{})
	if err != nil {
		return sdk.ModelStats{}, fromStatus(ctx, err)
	}
	return statsFromProto(r), nil
}

func (c *BackendClient) Shutdown(ctx context.Context) error {
	_, err := c.rpc.Shutdown(ctx, &backendv1.ShutdownRequest{})
	return fromStatus(ctx, err)
}
