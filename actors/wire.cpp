#include "actors/messages.hpp"

namespace troupe::actors {

void add_message_types(caf::actor_system_config& config) {
  config.add_message_type<engine::WorkerSpec>("troupe.WorkerSpec")
      .add_message_type<engine::LoadReport>("troupe.LoadReport")
      .add_message_type<engine::StepWork>("troupe.StepWork")
      .add_message_type<engine::StepOutput>("troupe.StepOutput")
      .add_message_type<engine::RequestEvent>("troupe.RequestEvent")
      .add_message_type<Submission>("troupe.Submission")
      .add_message_type<EngineStats>("troupe.EngineStats")
      .add_message_type<GroupJoin>("troupe.GroupJoin")
      .add_message_type<rendezvous_actor>("troupe.rendezvous");
}

}  // namespace troupe::actors
