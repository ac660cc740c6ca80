package wikisim.spark;

import org.apache.beam.runners.jobsubmission.JobServerDriver;
import org.apache.beam.runners.spark.SparkJobInvoker;
import org.apache.beam.runners.spark.SparkJobServerDriver.SparkServerConfiguration;
import org.apache.beam.sdk.fn.server.ServerFactory;
import org.apache.beam.sdk.io.FileSystems;
import org.apache.beam.sdk.options.PipelineOptionsFactory;
import org.kohsuke.args4j.CmdLineException;
import org.kohsuke.args4j.CmdLineParser;

/**
 * Beam 2.50's Spark job server, with its job and artifact services bound to the address they are
 * given (loopback by default) instead of every interface: SparkJobServerDriver with Beam's epoll
 * server factory, as infra/flink's LoopbackFlinkJobServer does for Flink (which says why), and the
 * same flags ({@code --spark-master-url}, {@code --job-port}, ...).
 */
public final class LoopbackSparkJobServer extends JobServerDriver {

  private LoopbackSparkJobServer(SparkServerConfiguration configuration) {
    super(
        configuration,
        ServerFactory.createEpollSocket(),
        ServerFactory.createEpollSocket(),
        () -> SparkJobInvoker.create(configuration));
  }

  public static void main(String[] args) throws CmdLineException {
    // As SparkJobServerDriver.main: the job server's own file systems (the staged artifacts).
    FileSystems.setDefaultPipelineOptions(PipelineOptionsFactory.create());
    SparkServerConfiguration configuration = new SparkServerConfiguration();
    new CmdLineParser(configuration).parseArgument(args);
    new LoopbackSparkJobServer(configuration).run();
  }
}
