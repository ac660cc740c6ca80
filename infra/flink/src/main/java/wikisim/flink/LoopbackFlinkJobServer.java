package wikisim.flink;

import org.apache.beam.runners.flink.FlinkJobInvoker;
import org.apache.beam.runners.flink.FlinkJobServerDriver;
import org.apache.beam.runners.flink.FlinkJobServerDriver.FlinkServerConfiguration;
import org.apache.beam.runners.jobsubmission.JobServerDriver;
import org.apache.beam.sdk.fn.server.ServerFactory;
import org.apache.beam.sdk.io.FileSystems;
import org.apache.beam.sdk.options.PipelineOptionsFactory;

/**
 * Beam 2.50's Flink job server, with its job and artifact services bound to the address they are
 * given (the loopback interface by default) instead of every interface.
 *
 * <p>{@code FlinkJobServerDriver} builds those two gRPC servers with Beam's default server
 * factory, which binds {@code NettyServerBuilder.forPort(port)}: the wildcard address, whatever
 * {@code --job-host} says, so a job server started for one local run would accept jobs (and
 * their staged code) from the whole network. Beam's own epoll factory binds the host and port
 * it is given ({@code forAddress}), and a dynamic port on the loopback address; this driver is
 * FlinkJobServerDriver with that factory, and the same flags ({@code --flink-master},
 * {@code --job-port}, ...). Written here because no served Beam release makes the binding a flag.
 */
public final class LoopbackFlinkJobServer extends JobServerDriver {

  private LoopbackFlinkJobServer(FlinkServerConfiguration configuration) {
    super(
        configuration,
        ServerFactory.createEpollSocket(),
        ServerFactory.createEpollSocket(),
        () -> FlinkJobInvoker.create(configuration));
  }

  public static void main(String[] args) {
    // As FlinkJobServerDriver.main: the job server's own file systems (the staged artifacts).
    FileSystems.setDefaultPipelineOptions(PipelineOptionsFactory.create());
    new LoopbackFlinkJobServer(FlinkJobServerDriver.parseArgs(args)).run();
  }
}
